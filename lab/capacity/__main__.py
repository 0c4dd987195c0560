"""`python -m lab.capacity`: the capacity lab's command line without the top-level CLI."""

import sys

from lab.capacity.cli import main

sys.exit(main())
