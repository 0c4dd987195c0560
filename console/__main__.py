"""`python -m console`: the same as `prefill-gate console`."""

from __future__ import annotations

import argparse
import sys

from console.cli import add_console_args, console_main


def main(argv: list[str] | None = None) -> int:
    """Parse the console's flags and run it."""
    parser = argparse.ArgumentParser(prog="python -m console", description="The prefill-gate console.")
    add_console_args(parser)
    return console_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
