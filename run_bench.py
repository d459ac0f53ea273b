#!/usr/bin/env python
"""clbench command line: run suites, list registries, rebuild leaderboards. See `python run_bench.py --help`."""

import sys

from clbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
