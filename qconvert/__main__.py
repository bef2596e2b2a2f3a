"""`python -m qconvert` runs the command line."""

import sys

from qconvert.cli import main

sys.exit(main())
