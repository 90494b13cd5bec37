"""A CUDA file's own project headers, found in the corpus and written out so the file compiles with them.

Most corpus ``.cu`` files do not compile alone because they include their project's headers
(``#include "common.cuh"``, ``#include <raft/core/x.cuh>``), and those headers are often in the corpus too
(same repository, same commit). :class:`HeaderIndex` holds every corpus file of every repository by path;
:meth:`HeaderIndex.resolve` follows a file's ``#include "..."`` and ``#include <...>`` lines transitively
through the headers it finds:

(a) the spelled path relative to the including file's folder, as a compiler tries first for a quoted
    include (an angle include found there also puts that folder on the include path);
(b) else the repository file whose path ends with ``/<spelled>`` (or is it): the only one, or the nearest
    (longest common folder prefix with the includer, then the shortest path, then by name). Its include
    root, the path less the spelled suffix, goes on the include path (``-I``).

An include found neither way (toolkit, system, torch, a vendored library, or a project header the corpus did
not keep) is left to the compiler. The walk is breadth first in text order, so the same corpus gives the same
answer; it stops at :data:`MAX_DEPTH` levels, :data:`MAX_FILES` files or :data:`MAX_BYTES` bytes (the
resolution is then *incomplete* and not used), and a file already seen is never read again, so a cycle ends.
A file whose includes lead back to itself is not complete either: its own text on disk would be a second
copy of the file whose hole is being filled.

:class:`HeaderTree` writes what tasks need under the build's output folder, as
``cu_projects/<owner>+<name>/<path>`` (the repository's own layout, so relative includes work there as they do
upstream), and prunes what no kept task needs. Headers come from any corpus file of the same repository,
held-out files included: they are compile context on disk, never prompt text.

Why our own code: include resolution lives inside compilers (clang, EDG, NVRTC) and build tools (CMake,
clangd via ``compile_commands.json``), all of which resolve against a file system and a known command line.
No maintained library resolves includes against an in-memory corpus of partial repositories with no build
files, which is the whole problem here; the two rules above are the compilers' own search order plus the
one guess (the include root from the spelled suffix) a build file would otherwise have told us.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from training.cuke.records import CuFile

PROJECTS_DIR = "cu_projects"
MAX_DEPTH = 32  # include nesting; real projects stay well under this
MAX_FILES = 512  # headers of one file's closure
MAX_BYTES = 32 * 1024 * 1024  # their total text

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)


class Include(NamedTuple):
    spelled: str  # as written, normalised to forward slashes
    angled: bool  # <...> rather than "..."


class Resolution(NamedTuple):
    """What a file needs from its repository: ``files`` (repository paths, sorted; never the file itself),
    ``roots`` (repository folders for ``-I``, ``""`` the repository root, in the order first needed),
    ``unresolved`` (spelled includes left to the compiler), ``complete`` (False: a bound cut the walk short or
    the file includes itself back, see ``reason``)."""

    repo: str
    path: str
    files: tuple[str, ...]
    roots: tuple[str, ...]
    unresolved: tuple[str, ...]
    complete: bool
    reason: str | None = None


class CompileContext(NamedTuple):
    """Where a file compiles with its headers, relative to the build's output folder (POSIX separators):
    ``folder`` the folder the file would sit in (first on the include path), ``include_paths`` the include
    roots after it, ``files`` the header files it needs on disk."""

    folder: str
    include_paths: tuple[str, ...]
    files: tuple[str, ...]

    def include_dirs(self, base: str | os.PathLike[str]) -> tuple[str, ...]:
        """Absolute ``-I`` folders under ``base``, the file's own folder first (the validator's order)."""
        return tuple(str(Path(base, p)) for p in (self.folder, *self.include_paths))

    def search_dirs(self) -> tuple[str, ...]:
        """Every folder a compile of this file looks in: its own, the roots, and each header's folder (quoted
        includes of a header start there)."""
        dirs = {self.folder, *self.include_paths, *(posixpath.dirname(f) for f in self.files)}
        return tuple(sorted(dirs))


def includes_of(text: str) -> list[Include]:
    """The ``#include`` lines of ``text`` in order (block comments skipped; ``#include MACRO`` ignored: only
    a preprocessor knows what it names)."""
    visible = _BLOCK_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [
        Include(m.group(2).strip().replace("\\", "/"), m.group(1) == "<") for m in _INCLUDE.finditer(visible)
    ]


def project_dir(repo: str) -> str:
    """``cu_projects/<owner>+<name>``: one folder per repository."""
    return f"{PROJECTS_DIR}/{repo.replace('/', '+')}"


def _common_parts(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split("/") if a else [], b.split("/") if b else [], strict=False):
        if x != y:
            break
        n += 1
    return n


def _safe(path: str) -> bool:
    """A repository-relative path that stays inside the repository (corpus paths are; this is the guard)."""
    norm = posixpath.normpath(path)
    return bool(path) and not posixpath.isabs(path) and norm != ".." and not norm.startswith("../")


class HeaderIndex:
    """Every corpus file of every repository by path, for :meth:`resolve` (any extension: a ``.cu`` file
    another one includes is a header like the rest)."""

    def __init__(self, files: Iterable[CuFile | tuple[str, str, str]]) -> None:
        self._texts: dict[str, dict[str, str]] = {}
        self._by_name: dict[str, dict[str, list[str]]] = {}
        for item in files:
            repo, path, text = (item.repo, item.path, item.text) if isinstance(item, CuFile) else item
            path = path.replace("\\", "/")
            if not _safe(path):
                continue
            self._texts.setdefault(repo, {})[path] = text
        for repo, texts in self._texts.items():
            names: dict[str, list[str]] = {}
            for path in sorted(texts):
                names.setdefault(posixpath.basename(path), []).append(path)
            self._by_name[repo] = names

    def text(self, repo: str, path: str) -> str:
        return self._texts[repo][path]

    def has(self, repo: str, path: str) -> bool:
        return path in self._texts.get(repo, {})

    def find(self, repo: str, includer: str, inc: Include) -> tuple[str, str | None] | None:
        """(repository path, include root or None when the includer's folder finds it) for ``inc`` written
        in ``includer``, or None when the repository has no such file (see the module docstring)."""
        texts = self._texts.get(repo)
        if not texts:
            return None
        here = posixpath.dirname(includer)
        beside = posixpath.normpath(posixpath.join(here, inc.spelled))
        if _safe(beside) and beside in texts:
            # a quoted include searches the includer's folder itself; an angle include needs it on -I
            return beside, (here if inc.angled else None)
        spelled = posixpath.normpath(inc.spelled)
        if not _safe(spelled):
            return None  # "../x.h" that did not resolve beside its includer: no suffix to match
        found = [
            p
            for p in self._by_name[repo].get(posixpath.basename(spelled), ())
            if p == spelled or p.endswith("/" + spelled)
        ]
        if not found:
            return None
        best = min(found, key=lambda p: (-_common_parts(posixpath.dirname(p), here), p.count("/"), p))
        return best, best[: len(best) - len(spelled)].rstrip("/")

    def resolve(self, repo: str, path: str, text: str) -> Resolution:
        """The repository headers ``text`` (the file ``path`` of ``repo``) needs, transitively."""
        path = path.replace("\\", "/")
        seen: set[str] = {path}
        files: list[str] = []
        roots: dict[str, None] = {}
        unresolved: dict[str, None] = {}
        total = 0
        queue: deque[tuple[str, str, int]] = deque([(path, text, 0)])
        while queue:
            includer, body, depth = queue.popleft()
            for inc in includes_of(body):
                hit = self.find(repo, includer, inc)
                if hit is None:
                    unresolved.setdefault(inc.spelled)
                    continue
                target, root = hit
                if target == path:
                    return self._incomplete(repo, path, files, roots, unresolved, "includes itself back")
                if root is not None and root != posixpath.dirname(path):
                    roots.setdefault(root)
                if target in seen:
                    continue
                seen.add(target)
                if depth + 1 > MAX_DEPTH:
                    return self._incomplete(repo, path, files, roots, unresolved, f"deeper than {MAX_DEPTH}")
                header = self.text(repo, target)
                files.append(target)
                total += len(header)
                if len(files) > MAX_FILES or total > MAX_BYTES:
                    why = f"more than {MAX_FILES} headers or {MAX_BYTES >> 20} MiB"
                    return self._incomplete(repo, path, files, roots, unresolved, why)
                queue.append((target, header, depth + 1))
        return Resolution(repo, path, tuple(sorted(files)), tuple(roots), tuple(unresolved), True)

    @staticmethod
    def _incomplete(
        repo: str, path: str, files: list[str], roots: dict, unresolved: dict, reason: str
    ) -> Resolution:
        return Resolution(repo, path, tuple(sorted(files)), tuple(roots), tuple(unresolved), False, reason)


@dataclass
class TreeStats:
    """What :class:`HeaderTree` wrote and kept, for the report."""

    staged_files: int = 0  # files whose headers were written before compiling
    written: int = 0  # header files written
    kept: int = 0  # header files left after pruning
    kept_bytes: int = 0
    pruned: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "staged_files": self.staged_files,
            "written": self.written,
            "kept": self.kept,
            "kept_bytes": self.kept_bytes,
            "pruned": self.pruned,
        }


class HeaderTree:
    """The headers tasks compile with, on disk under ``base/cu_projects``.

    :meth:`stage` writes the headers of every file that may need them *before* any compile, so every compile
    sees the same tree whatever the order or the number of workers; :meth:`prune` then removes what no kept
    task needs and says what went, so the caller can compile again the kept files that could have seen a
    removed header (a compile may open a file the resolver did not choose, e.g. one shadowing another on the
    include path)."""

    def __init__(self, index: HeaderIndex, base: str | os.PathLike[str]) -> None:
        self.index = index
        self.base = Path(base)
        self.stats = TreeStats()
        self._written: set[str] = set()  # relative to base

    def reset(self) -> None:
        """Start from nothing: a tree left by an earlier build would hold headers this one never chose."""
        shutil.rmtree(self.base / PROJECTS_DIR, ignore_errors=True)
        self._written.clear()

    def context(self, repo: str, path: str, text: str) -> CompileContext | None:
        """Where ``path`` compiles with its repository headers, or None when it includes none (or the
        resolution is incomplete)."""
        res = self.index.resolve(repo, path, text)
        if not res.complete or not res.files:
            return None
        top = project_dir(repo)

        def under(p: str) -> str:
            return f"{top}/{p}" if p else top

        return CompileContext(
            under(posixpath.dirname(res.path)),
            tuple(under(r) for r in res.roots),
            tuple(under(f) for f in res.files),
        )

    def stage(self, files: Iterable[CuFile]) -> dict[str, CompileContext]:
        """Write the headers of ``files`` (each once per tree); their contexts by file id."""
        contexts: dict[str, CompileContext] = {}
        for f in files:
            ctx = self.context(f.repo, f.path, f.text)
            if ctx is None:
                continue
            contexts[f.id] = ctx
            self.stats.staged_files += 1
            self._write(f.repo, ctx)
        return contexts

    def _write(self, repo: str, ctx: CompileContext) -> None:
        top = project_dir(repo) + "/"
        for rel in ctx.files:
            if rel in self._written:
                continue
            target = self.base / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            # newline="" keeps the corpus bytes as they are (CRLF files stay CRLF)
            with target.open("w", encoding="utf-8", newline="") as fh:
                fh.write(self.index.text(repo, rel[len(top) :]))
            self._written.add(rel)
            self.stats.written += 1
        (self.base / ctx.folder).mkdir(parents=True, exist_ok=True)

    def prune(self, keep: Mapping[str, CompileContext]) -> set[str]:
        """Remove every written header no context in ``keep`` needs (and folders left empty, but never a kept
        task's own folder); the removed paths (relative to the base)."""
        needed = {rel for ctx in keep.values() for rel in ctx.files}
        removed = self._written - needed
        for rel in sorted(removed):
            (self.base / rel).unlink(missing_ok=True)
        self._written -= removed
        self.stats.pruned += len(removed)
        root = self.base / PROJECTS_DIR
        if root.is_dir():
            for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                if not any(folder.iterdir()):
                    folder.rmdir()
        for ctx in keep.values():
            (self.base / ctx.folder).mkdir(parents=True, exist_ok=True)
        self.stats.kept = len(self._written)
        self.stats.kept_bytes = sum((self.base / rel).stat().st_size for rel in self._written)
        return removed


def sees_any(ctx: CompileContext, paths: Iterable[str]) -> bool:
    """Whether a compile in ``ctx`` could open one of ``paths`` (relative to the same base): one lies under a
    folder it searches."""
    dirs = tuple(d + "/" for d in ctx.search_dirs())
    return any(p.startswith(dirs) for p in paths)


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_FILES",
    "PROJECTS_DIR",
    "CompileContext",
    "HeaderIndex",
    "HeaderTree",
    "Include",
    "Resolution",
    "TreeStats",
    "includes_of",
    "project_dir",
    "sees_any",
]
