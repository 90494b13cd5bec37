"""The ``dice`` command line: a thin dispatcher over the sub-command modules in :mod:`dice.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dice import __version__

# One module per top-level sub-command; each defines ``add_parser(subparsers) -> None``.
COMMAND_MODULES: tuple[str, ...] = (
    "dice.commands.masks",
    "dice.commands.complete",
    "dice.commands.generate",
    "dice.commands.train",
    "dice.commands.validate",
    "dice.commands.eval",
)


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def read_text_file(path: Path) -> str:
    """A source file's text exactly as stored (no newline translation); CliError when it cannot be read."""
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a folder, not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{path}: not UTF-8 text (byte {exc.start} is invalid)") from exc


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it, so that a crash never leaves
    half a file. An existing file keeps its permissions; a new one gets the umask's default."""
    if path.exists():
        mode = path.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".dice", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dice",
        description=(
            "DICE kernel assistant: fill masks in CUDA files and generate kernels, validated on your GPU."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dice {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
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
