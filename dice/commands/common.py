"""What every sub-command shares: the user-facing error and reading and writing the user's files (through
``dice.safeio``: regular files only, sizes capped, writes that keep links, owner and mode)."""

from __future__ import annotations

import os
from pathlib import Path

from dice import safeio


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def read_user_file(
    path: Path, *, what: str = "source file", max_bytes: int = safeio.SOURCE_LIMIT
) -> safeio.UserFile:
    """A user-named file's bytes and stat (``dice.safeio.read_user_file``); CliError when it cannot be read:
    no such file, a folder, a FIFO or device (refused at once, never read), over ``max_bytes``."""
    try:
        return safeio.read_user_file(path, max_bytes=max_bytes, what=what)
    except safeio.UserFileError as exc:
        raise CliError(str(exc)) from exc


def read_text_file(path: Path, *, what: str = "source file", max_bytes: int = safeio.SOURCE_LIMIT) -> str:
    """A source file's text exactly as stored (no newline translation); CliError when it cannot be read or
    is not UTF-8."""
    return read_text_and_stat(path, what=what, max_bytes=max_bytes)[0]


def read_text_and_stat(
    path: Path, *, what: str = "source file", max_bytes: int = safeio.SOURCE_LIMIT
) -> tuple[str, os.stat_result]:
    """:func:`read_text_file` and the stat of the file it read (what ``write_user_file(expected_stat=)``
    compares before writing over it)."""
    read = read_user_file(path, what=what, max_bytes=max_bytes)
    try:
        return read.text(), read.stat
    except safeio.UserFileError as exc:
        raise CliError(str(exc)) from exc


def check_input_file(path: Path, *, what: str, max_bytes: int) -> None:
    """CliError unless ``path`` is a regular file of at most ``max_bytes`` (for files another library
    reads itself: a problem set, a corpus, a config template)."""
    try:
        safeio.check_user_file(path, max_bytes=max_bytes, what=what)
    except safeio.UserFileError as exc:
        raise CliError(str(exc)) from exc


def write_user_file(
    path: Path, text: str, *, expected_stat: os.stat_result | None = None, exclusive: bool = False
) -> Path:
    """Write ``text`` (UTF-8) to the user's file ``path`` (``dice.safeio.write_user_file``: through symlinks,
    keeping hard links, owner and mode, atomic and fsynced); CliError when it is refused: read-only, a folder
    DICE cannot write in, exists (``exclusive``): exit 2; changed on disk since ``expected_stat``: exit 1."""
    try:
        return safeio.write_user_file(path, text, expected_stat=expected_stat, exclusive=exclusive)
    except safeio.UserFileError as exc:
        raise CliError(str(exc), code=1 if isinstance(exc, safeio.FileChangedError) else 2) from exc


def check_writable(path: Path, *, exclusive: bool = False) -> None:
    """CliError when ``write_user_file`` would refuse ``path`` (read-only, its folder not writable, not a
    regular file; ``exclusive``: it exists): said before the model runs, not after."""
    try:
        safeio.check_writable(path, exclusive=exclusive)
    except safeio.UserFileError as exc:
        raise CliError(str(exc)) from exc


def print_json(value: object, **kwargs: object) -> None:
    """``--json`` output: strict JSON (``dice.safeio.dumps_strict``: NaN/inf -> null + ``non_finite``)."""
    print(safeio.dumps_strict(value, **kwargs))  # type: ignore[arg-type]


# What `dice masks` / `dice complete` read: CUDA sources and the C++ files that hold device code too.
CUDA_SUFFIXES = frozenset(
    {".cu", ".cuh", ".cuda", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".hxx", ".inl"}
)


def require_cuda_source(path: Path) -> None:
    """CliError for a file that is not CUDA/C++ source (a Markdown file's ``<MASK>`` is not a hole); a
    missing path, a folder, a FIFO or a device gets the reader's own message first."""
    if not path.is_file():
        read_text_file(path)
    if path.suffix.lower() not in CUDA_SUFFIXES:
        known = ", ".join(sorted(CUDA_SUFFIXES))
        raise CliError(f"{path}: not a CUDA or C++ source file (expected one of {known})")
