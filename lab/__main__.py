"""`python -m lab`: the lab's command line without the top-level CLI."""

import sys

from lab.cli import main

sys.exit(main())
