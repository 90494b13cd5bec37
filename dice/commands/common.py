"""What every sub-command shares: the user-facing error and reading and writing the user's files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


# What `dice masks` / `dice complete` read: CUDA sources and the C++ files that hold device code too.
CUDA_SUFFIXES = frozenset(
    {".cu", ".cuh", ".cuda", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".hxx", ".inl"}
)


def require_cuda_source(path: Path) -> None:
    """CliError for a file that is not CUDA/C++ source (a Markdown file's ``<MASK>`` is not a hole); a
    missing path or a folder gets the reader's own message first."""
    if not path.exists() or path.is_dir():
        read_text_file(path)
    if path.suffix.lower() not in CUDA_SUFFIXES:
        known = ", ".join(sorted(CUDA_SUFFIXES))
        raise CliError(f"{path}: not a CUDA or C++ source file (expected one of {known})")
