#!/usr/bin/env python
"""clbench command line from a clone (the same as the installed ``clbench`` and ``python -m clbench``): run suites,
list registries, rebuild leaderboards. See `python run_bench.py --help`."""

import sys

from clbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
