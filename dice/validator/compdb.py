"""Compilation databases (``compile_commands.json``): finding one the way clangd does, reading its entries
(CMake, Bear and Ninja ``-t compdb`` formats), the entry of a file, and the entry a header or a file without
one borrows (a translation unit that includes it, else one in the same folder, else the nearest).

Nothing here filters flags (:mod:`dice.validator.build_flags` does); reads are cached by file stamp, so a
worker that checks many fills of one file reads the database and the includers once.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DATABASE_NAME = "compile_commands.json"
MAX_DATABASE_BYTES = 256 * 1024 * 1024
MAX_SCANNED_TU_BYTES = 4 * 1024 * 1024
MAX_SCANNED_TUS = 4000
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\r\n]+)[>"]', re.MULTILINE)


@dataclass(frozen=True)
class CompileEntry:
    """One command of a database: ``file`` and ``directory`` absolute, ``argv`` the whole command line."""

    file: str
    directory: str
    argv: tuple[str, ...]
    database: str


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _key(path: str) -> str:
    return os.path.normcase(os.path.normpath(path))


def _real_key(path: str) -> str:
    return _key(os.path.realpath(path))


def database_candidates(folder: str | os.PathLike[str]) -> list[str]:
    """The ``compile_commands.json`` files clangd would consider for a file in ``folder``, nearest first:
    in the folder and each ancestor, that folder's own file, then its ``build/`` and other ``build*/``
    folders' (``build`` first, the others by name). Only existing files are returned."""
    found: list[str] = []
    current = Path(os.path.abspath(os.fspath(folder)))
    for directory in (current, *current.parents):
        own = directory / DATABASE_NAME
        if own.is_file():
            found.append(str(own))
        try:
            builds = sorted(
                (e.name for e in os.scandir(directory) if e.name.startswith("build") and e.is_dir()),
                key=lambda name: (name != "build", name),
            )
        except OSError:
            builds = []
        for name in builds:
            candidate = directory / name / DATABASE_NAME
            if candidate.is_file():
                found.append(str(candidate))
    return found


def explicit_database(path: str | os.PathLike[str]) -> str | None:
    """The database a caller named: a ``compile_commands.json`` file, or a folder holding one (directly or
    in a ``build*/`` folder). None when there is none."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if p.is_file():
        return str(p.resolve())
    if p.is_dir():
        if (p / DATABASE_NAME).is_file():
            return str((p / DATABASE_NAME).resolve())
        for name in sorted(
            (c.name for c in p.iterdir() if c.name.startswith("build")), key=lambda n: n != "build"
        ):
            if (p / name / DATABASE_NAME).is_file():
                return str((p / name / DATABASE_NAME).resolve())
    return None


_DATABASES: dict[str, tuple[tuple[int, int] | None, list[CompileEntry], str | None]] = {}


def load_database(path: str) -> tuple[list[CompileEntry], str | None]:
    """The entries of a database and an error text (None when it read well). Entries without a file or a
    command are skipped; a relative ``directory`` is taken from the database's folder, a relative ``file``
    from ``directory`` (or, when nothing is there, from the database's folder)."""
    stamp = _stamp(path)
    cached = _DATABASES.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    entries: list[CompileEntry] = []
    error: str | None = None
    try:
        if stamp is not None and stamp[1] > MAX_DATABASE_BYTES:
            raise ValueError(f"larger than {MAX_DATABASE_BYTES // (1024 * 1024)} MiB")
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
        if not isinstance(data, list):
            raise ValueError("not a JSON list of commands")
        base = os.path.dirname(os.path.abspath(path))
        entries = [e for e in (_entry(obj, base, path) for obj in data) if e is not None]
    except (OSError, ValueError) as exc:
        error = f"{path}: {exc}"
    if len(_DATABASES) > 32:
        _DATABASES.clear()
    _DATABASES[path] = (stamp, entries, error)
    return entries, error


def _entry(obj: object, base: str, database: str) -> CompileEntry | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("file"), str):
        return None
    directory = obj.get("directory") if isinstance(obj.get("directory"), str) else base
    directory = os.path.join(base, directory) if not os.path.isabs(directory) else directory
    arguments = obj.get("arguments")
    if isinstance(arguments, list) and all(isinstance(a, str) for a in arguments):
        argv = tuple(arguments)
    elif isinstance(obj.get("command"), str):
        try:
            argv = tuple(shlex.split(obj["command"]))
        except ValueError:
            return None
    else:
        return None
    file = obj["file"]
    if not os.path.isabs(file):
        in_directory = os.path.join(directory, file)
        file = in_directory if os.path.exists(in_directory) else os.path.join(base, file)
    return CompileEntry(os.path.normpath(file), os.path.normpath(directory), argv, database)


def find_entry(entries: Sequence[CompileEntry], path: str) -> CompileEntry | None:
    """The entry whose file is ``path`` (compared as written and with links resolved)."""
    key, real = _key(path), _real_key(path)
    for entry in entries:
        if _key(entry.file) == key:
            return entry
    for entry in entries:
        if _real_key(entry.file) == real:
            return entry
    return None


_INCLUDES: dict[str, tuple[tuple[int, int] | None, tuple[str, ...]]] = {}


def quoted_and_angled_includes(path: str) -> tuple[str, ...]:
    """The names a file ``#include``s (``"../mmf.cuh"``, ``<cub/cub.cuh>``), read at most once per stamp."""
    stamp = _stamp(path)
    cached = _INCLUDES.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    names: tuple[str, ...] = ()
    if stamp is not None and stamp[1] <= MAX_SCANNED_TU_BYTES:
        try:
            with open(path, "rb") as f:
                names = tuple(
                    m.group(1).decode("utf-8", "replace").strip() for m in _INCLUDE.finditer(f.read())
                )
        except OSError:
            names = ()
    if len(_INCLUDES) > 20000:
        _INCLUDES.clear()
    _INCLUDES[path] = (stamp, names)
    return names


def _shared_depth(a: str, b: str) -> int:
    pa, pb = Path(a).parts, Path(b).parts
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    return n


def includers(
    entries: Sequence[CompileEntry],
    target: str,
    include_dirs: Callable[[CompileEntry], Iterable[str]],
) -> list[CompileEntry]:
    """Entries whose file ``#include``s ``target`` directly, best first: those whose include resolves to it
    (from the file's folder or one of its own include folders) before those that only name a file of the
    same name, then by how close they are to ``target``."""
    name = os.path.basename(target)
    real = _real_key(target)
    strong: list[CompileEntry] = []
    weak: list[CompileEntry] = []
    for entry in list(entries)[:MAX_SCANNED_TUS]:
        if _key(entry.file) == _key(target):
            continue
        named = [inc for inc in quoted_and_angled_includes(entry.file) if os.path.basename(inc) == name]
        if not named:
            continue
        folders = [os.path.dirname(entry.file), *include_dirs(entry)]
        resolves = any(
            _real_key(os.path.join(folder, inc)) == real and os.path.exists(os.path.join(folder, inc))
            for inc in named
            for folder in folders
        )
        (strong if resolves else weak).append(entry)
    order = lambda e: (-_shared_depth(e.file, target), e.file)  # noqa: E731
    return sorted(strong, key=order) + sorted(weak, key=order)


def nearest_entries(
    entries: Sequence[CompileEntry], target: str
) -> tuple[list[CompileEntry], list[CompileEntry]]:
    """(entries in ``target``'s folder, every entry), each sorted nearest first (sharing most of the path,
    then by name), for a file nothing includes."""
    folder = _key(os.path.dirname(target))
    ranked = sorted(
        (e for e in entries if _key(e.file) != _key(target)),
        key=lambda e: (-_shared_depth(e.file, target), e.file),
    )
    same = [e for e in ranked if _key(os.path.dirname(e.file)) == folder]
    return same, ranked


def database_stamps(folder: str | os.PathLike[str] | None, explicit: str | None = None) -> list[list[object]]:
    """(path, mtime_ns, size) of the database a file in ``folder`` would use: part of the verdict cache key,
    so that an edited ``compile_commands.json`` is never answered from a stale verdict."""
    if folder is None and explicit is None:
        return []
    paths: list[str] = []
    if explicit:
        chosen = explicit_database(explicit)
        paths += [chosen] if chosen else []
    if not paths and folder is not None:
        paths = database_candidates(folder)
    stamps: list[list[object]] = []
    for path in paths:
        stamp = _stamp(path) or (-1, -1)
        stamps.append([path, stamp[0], stamp[1]])
    return stamps
