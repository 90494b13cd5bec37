"""The user's files and the JSON clients parse: one set of rules for the CLI, the LSP, the assistant and the
validator (floor 0 of docs/INTERNALS.md: standard library only, nothing of the project).

Reading (:func:`read_user_file`): only regular files. A FIFO blocks its reader until a writer comes, a
device such as ``/dev/zero`` never ends, a folder or a socket is not a source: the kind is checked with
``stat`` before anything is opened (opening a device can have effects of its own), then again on the open
descriptor (the path may have been swapped meanwhile). The size is capped twice: ``st_size`` first, then a
bounded read, so a file that grows while it is read, or reports no size (``/proc``), stops at the cap.

Writing (:func:`write_user_file`): the file a symlink names is written (the link stays a link); a file
with several hard links is rewritten in place (a rename would split them); any other file is replaced
atomically by a unique temporary file beside it that carries the old file's mode and, where allowed, its
owner and group (when neither can be kept the file is rewritten in place instead, so its owner never
changes). File and folder are fsynced. Read-only files, non-regular files, folders DICE cannot write in and
files changed on disk since they were read are refused with a message, never a traceback.

Strict JSON (:func:`strict_json`, :func:`dumps_strict`): ``NaN`` and ``Infinity`` are not JSON, and
``JSON.parse`` (VS Code's JSON-RPC) rejects them. A non-finite number becomes ``null`` and the object that
holds it gets ``"non_finite": {"<field>": "NaN" | "Infinity" | "-Infinity"}`` (docs/CONTRACTS.md, "The
verdict"); serialisation runs with ``allow_nan=False`` so that anything that slips through fails loudly.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# Caps on what DICE reads from a user-named file. A source (.cu/.cuh, a KernelBench .py, a candidate): the
# editor analyses documents of up to 32 M characters (lsp_server.documents.MAX_ANALYSED_CHARS).
SOURCE_LIMIT = 32 * MIB
# Small configuration files (compile_commands.json is read by the validator: large projects have big ones).
CONFIG_LIMIT = 256 * MIB
# Data files streamed by the evaluation and training code (problem sets, corpora, held-out splits).
DATA_LIMIT = 16 * GIB

_READ_CHUNK = MIB
NON_FINITE_KEY = "non_finite"
_O_READ = (
    os.O_RDONLY
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in after the stat must not block the open
    | getattr(os, "O_NOCTTY", 0)
)


class UserFileError(Exception):
    """A user's file that cannot be read or written; ``str()`` is the message to show (it names the path)."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path = Path(path)
        self.reason = reason


class FileChangedError(UserFileError):
    """The file changed on disk since it was read: writing would lose that edit."""


def format_size(n: int) -> str:
    """``512 bytes``, ``1.5 KiB``, ``32 MiB``, ``16 GiB``."""
    if n < KIB:
        return f"{n} byte{'s' if n != 1 else ''}"
    for unit, name in ((GIB * 1024, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit:
            return f"{n / unit:.1f}".removesuffix(".0") + f" {name}"
    raise AssertionError(n)  # pragma: no cover - n >= KIB matched KiB at the latest


def describe_kind(mode: int) -> str:
    """What a non-regular file is, as the refusal says it."""
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    for test, name in (
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return f"is {name}, not a regular file"
    return "is not a regular file"


# ------------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class UserFile:
    """What :func:`read_user_file` read: the bytes and the ``stat`` of the file they came from."""

    path: Path
    data: bytes
    stat: os.stat_result

    def text(self, errors: str = "strict") -> str:
        """The UTF-8 text exactly as stored (no newline translation); UserFileError when it is not UTF-8."""
        try:
            return self.data.decode("utf-8", errors)
        except UnicodeDecodeError as exc:
            raise UserFileError(self.path, f"not UTF-8 text (byte {exc.start} is invalid)") from exc


def _access_error(path: Path, exc: OSError, verb: str = "read") -> UserFileError:
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return UserFileError(path, "no such file")
    return UserFileError(path, f"cannot {verb} it ({exc.strerror or exc})")


def _check_regular(path: Path, st: os.stat_result, *, max_bytes: int, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = describe_kind(st.st_mode)
        raise UserFileError(
            path, kind if stat.S_ISDIR(st.st_mode) else f"{kind} (DICE reads regular files only)"
        )
    if st.st_size > max_bytes:
        raise UserFileError(
            path,
            f"the {what} is too large: {format_size(st.st_size)} ({st.st_size} bytes), over the "
            f"{format_size(max_bytes)} limit",
        )


def check_user_file(path: str | os.PathLike[str], *, max_bytes: int, what: str) -> os.stat_result:
    """The ``stat`` of ``path`` when it is a regular file of at most ``max_bytes`` (symlinks followed);
    UserFileError otherwise. For files another library opens itself (a problem set, a training corpus):
    it is the same check :func:`read_user_file` makes before it reads."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _access_error(path, exc) from exc
    _check_regular(path, st, max_bytes=max_bytes, what=what)
    return st


def read_user_file(path: str | os.PathLike[str], *, max_bytes: int, what: str) -> UserFile:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them, read with a bounded read.

    ``what`` names the file in the size message ("CUDA source" -> "the CUDA source is too large: 1.2 GiB
    (...), over the 32 MiB limit"). UserFileError (message names the path) for: no such file, a folder, a
    FIFO / device / socket (refused before it is opened: no read ever blocks on it), over the cap (by its
    size, or by what a read returned), no permission.
    """
    path = Path(path)
    check_user_file(path, max_bytes=max_bytes, what=what)
    try:
        fd = os.open(path, _O_READ)
    except OSError as exc:
        raise _access_error(path, exc) from exc
    try:
        st = os.fstat(fd)
        _check_regular(path, st, max_bytes=max_bytes, what=what)  # the path was swapped since the stat
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise UserFileError(
                    path,
                    f"the {what} is too large: over the {format_size(max_bytes)} limit "
                    "(it grew while DICE read it)",
                )
    except OSError as exc:
        raise _access_error(path, exc) from exc
    finally:
        os.close(fd)
    return UserFile(path, b"".join(chunks), st)


def read_user_text(path: str | os.PathLike[str], *, max_bytes: int, what: str, errors: str = "strict") -> str:
    """:func:`read_user_file` decoded as UTF-8 (``errors="replace"`` for a lenient reader)."""
    return read_user_file(path, max_bytes=max_bytes, what=what).text(errors)


# ------------------------------------------------------------------------------------------------ writing


def same_file_state(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats are of the same file, unchanged (device, inode, size, mtime)."""
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns)


def write_user_file(
    path: str | os.PathLike[str],
    content: str | bytes,
    *,
    expected_stat: os.stat_result | None = None,
    exclusive: bool = False,
) -> Path:
    """Write ``content`` (str: UTF-8) to the user's file ``path``; returns the path actually written.

    - a symlink: its target is written (``realpath``), the link stays a link;
    - several hard links (``st_nlink > 1``): written in place (write, truncate, fsync): a rename would split
      them; also a file whose owner or group this process cannot give a new file (not root, not its own);
    - otherwise: a unique temporary file beside the target (``tempfile.mkstemp``) gets the content, the old
      file's mode, owner and group, is fsynced and renamed over it, then the folder is fsynced;
    - a new file: the same temporary file with the umask's mode; ``exclusive``: never replaces anything
      that exists meanwhile (published with ``link``, so a file that appeared is refused, not clobbered).

    UserFileError (no traceback) for a read-only file ("is read-only (mode 0444)"), a folder DICE cannot
    write in, a folder that does not exist, a non-regular file, or any OS error; FileChangedError when
    ``expected_stat`` (taken when the file was read) no longer matches (:func:`same_file_state`).
    """
    data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    path = Path(path)
    if exclusive:
        _create_new(path, data)
        return path
    target, st = _writable_target(path)
    if st is None:
        if expected_stat is not None:
            raise FileChangedError(path, "was removed on disk since DICE read it; not writing it")
        _create_new(target, data, replace=True, shown=path)
        return target
    if expected_stat is not None and not same_file_state(st, expected_stat):
        raise FileChangedError(path, "changed on disk since DICE read it; not writing it (run it again)")
    try:
        if _in_place(st) or not _replace(path, target, data, st):
            _write_in_place(target, data)
    except OSError as exc:
        raise _access_error(path, exc, "write") from exc
    return target


def check_writable(path: str | os.PathLike[str], *, exclusive: bool = False) -> None:
    """UserFileError when :func:`write_user_file` would refuse ``path`` for its kind, its mode or its
    folder: said before long work (a model run) rather than after it."""
    path = Path(path)
    if exclusive:
        absolute = Path(os.path.abspath(path))
        _require_writable_folder(absolute, absolute.parent)
        if os.path.lexists(absolute):
            raise UserFileError(path, "exists; not overwriting it")
        return
    target, st = _writable_target(path)
    if st is None or not _in_place(st):
        _require_writable_folder(path, target.parent)


def _writable_target(path: Path) -> tuple[Path, os.stat_result | None]:
    """The file a write of ``path`` goes to (symlinks resolved) and its stat (None: it does not exist);
    UserFileError for a non-regular or read-only file."""
    target = Path(os.path.realpath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target, None
    except OSError as exc:
        raise _access_error(path, exc, "write") from exc
    if not stat.S_ISREG(st.st_mode):
        raise UserFileError(path, f"{describe_kind(st.st_mode)} (DICE writes regular files only)")
    # root may write anything: a file with no write bit at all is read-only on purpose
    if not os.access(target, os.W_OK) or not st.st_mode & 0o222:
        raise UserFileError(
            path,
            f"is read-only (mode {stat.S_IMODE(st.st_mode):04o}); not writing it (make it writable first)",
        )
    return target, st


def _in_place(st: os.stat_result) -> bool:
    """Whether an existing file must be rewritten in place: a rename would split its hard links, or give
    it this process's owner or group."""
    if st.st_nlink > 1:
        return True
    if not hasattr(os, "geteuid") or os.geteuid() == 0:
        return False
    return st.st_uid != os.geteuid() or st.st_gid not in {os.getegid(), *os.getgroups()}


def _require_writable_folder(path: Path, folder: Path) -> None:
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise UserFileError(path, f"no such folder {folder}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UserFileError(path, f"{folder} is not a folder")
    if os.access(folder, os.W_OK | os.X_OK) and st.st_mode & 0o222:
        return
    if not st.st_mode & 0o222:
        why = f"the folder is read-only (mode {stat.S_IMODE(st.st_mode):04o})"
    elif hasattr(os, "statvfs") and os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 1):
        why = "it is on a read-only file system"
    else:
        why = "permission denied"
    raise UserFileError(
        path,
        f"cannot write in its folder {folder}: {why}; DICE writes a temporary file beside the file and "
        "renames it, so that the file is never left half-written",
    )


def _temp_beside(target: Path) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".dice-tmp", dir=target.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _keep_owner(fd: int, st: os.stat_result) -> bool:
    """Give the temporary file ``st``'s owner and group; False when that is not allowed."""
    now = os.fstat(fd)
    if (now.st_uid, now.st_gid) == (st.st_uid, st.st_gid):
        return True
    if not hasattr(os, "fchown"):
        return False
    try:
        os.fchown(fd, st.st_uid, st.st_gid)
    except PermissionError:
        return False
    return True


def _replace(path: Path, target: Path, data: bytes, st: os.stat_result) -> bool:
    """The atomic replacement of an existing file; False (nothing changed) when its owner cannot be kept."""
    _require_writable_folder(path, target.parent)
    fd, tmp = _temp_beside(target)
    try:
        if not _keep_owner(fd, st):
            os.close(fd)
            fd = -1
            os.unlink(tmp)
            return False
        _write_all(fd, data)
        os.fchmod(fd, stat.S_IMODE(st.st_mode))  # after fchown, which clears set-id bits
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(target.parent)
    return True


def _write_in_place(target: Path, data: bytes) -> None:
    fd = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        _write_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, without setting it (``os.umask`` sets it process-wide: a race with threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _create_new(path: Path, data: bytes, *, replace: bool = False, shown: Path | None = None) -> None:
    """A new file at ``path`` with the umask's mode; without ``replace``, one that exists is refused.
    Messages name ``shown`` (the path the user gave), else ``path``."""
    shown = shown or path
    path = Path(os.path.abspath(path))
    _require_writable_folder(shown, path.parent)
    if not replace and os.path.lexists(path):
        raise UserFileError(shown, "exists; not overwriting it")
    mode = 0o666 & ~_umask()
    try:
        fd, tmp = _temp_beside(path)
    except OSError as exc:
        raise _access_error(shown, exc, "write") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _publish_exclusive(tmp, path, data, mode)
    except FileExistsError as exc:
        raise UserFileError(shown, "exists; not overwriting it") from exc
    except OSError as exc:
        raise _access_error(shown, exc, "write") from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    _fsync_folder(path.parent)


def _publish_exclusive(tmp: str, path: Path, data: bytes, mode: int) -> None:
    """``link`` fails when ``path`` exists (a rename would replace it). File systems without hard links
    get an ``O_EXCL`` create and a direct write instead."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


# -------------------------------------------------------------------------------------------- strict JSON


def _spelling(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _clean(value: Any) -> tuple[Any, dict[str, str]]:
    """(a JSON-safe copy of ``value``, the non-finite numbers no object inside it took: {path: spelling})."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value, {}
    if isinstance(value, float) or (
        isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
    ):
        number = float(value)
        return (number, {}) if math.isfinite(number) else (None, {"": _spelling(number)})
    if isinstance(value, numbers.Integral):  # a NumPy integer: json cannot write it as it is
        return int(value), {}
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        flagged: dict[str, str] = {}
        for key, item in value.items():
            out[key], found = _clean(item)
            flagged.update({f"{key}{sub}": spelled for sub, spelled in found.items()})
        if flagged:
            previous = out.get(NON_FINITE_KEY)
            out[NON_FINITE_KEY] = {**(previous if isinstance(previous, Mapping) else {}), **flagged}
        return out, {}
    if isinstance(value, (list, tuple)):
        items: list[Any] = []
        lifted: dict[str, str] = {}
        for i, item in enumerate(value):
            clean, found = _clean(item)
            items.append(clean)
            lifted.update({f"[{i}]{sub}": spelled for sub, spelled in found.items()})
        return items, lifted
    return value, {}  # anything else: json.dumps decides (a TypeError names it)


def strict_json(value: Any) -> Any:
    """A copy of ``value`` that strict JSON parsers accept: every non-finite number (NaN, ±inf) becomes
    None, and the nearest object holding it gets ``"non_finite": {"<field>": "NaN" | "Infinity" |
    "-Infinity"}``; a number inside lists is named by its path from that object (``"losses[3]"``). Values
    already strict come back equal (idempotent). Tuples become lists."""
    return _clean(value)[0]


def non_finite_value(obj: Mapping[str, Any], key: str) -> float | None:
    """The non-finite number :func:`strict_json` replaced at ``obj[key]``, else None."""
    flagged = obj.get(NON_FINITE_KEY)
    spelled = flagged.get(key) if isinstance(flagged, Mapping) else None
    if spelled not in ("NaN", "Infinity", "-Infinity"):
        return None
    return float(spelled)


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict_json` (value), with ``allow_nan=False``: what every client-facing
    JSON of DICE goes through (CLI ``--json``, verdict JSON, eval JSONL and summaries)."""
    return json.dumps(strict_json(value), allow_nan=False, **kwargs)
