"""The ``dice`` command line: a thin dispatcher over the sub-command modules in :mod:`dice.commands`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dice import __version__
from dice.commands import complete, cuke, doctor, eval, generate, masks, serve, train, validate
from dice.commands.common import CliError

# One module per top-level sub-command; each defines ``add_parser(subparsers) -> None`` and imports what
# its command runs only when it runs (``dice masks`` never imports torch).
COMMAND_MODULES = (masks, complete, generate, serve, train, cuke, validate, eval, doctor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dice",
        description=(
            "DICE kernel assistant: fill masks in CUDA files and generate kernels, validated on your GPU."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dice {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except CliError as exc:
        print(f"dice: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("dice: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
