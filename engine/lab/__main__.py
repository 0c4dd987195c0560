"""`python -m engine.lab`: the lab's command line without the top-level CLI."""

import sys

from engine.lab.cli import main

sys.exit(main())
