"""``python -m clbench``: the ``clbench`` command line (:mod:`clbench.cli`)."""

import sys

from clbench.cli import main

sys.exit(main())
