"""The local Python files a ``.cu`` file's ``dice-spec`` depends on: which ones (so a front end can watch them
and revalidate when one changes) and importing them fresh in the worker (:func:`spec_folder_imports`).

A dice-spec may ``import ref`` from the ``.cu`` file's own folder; the worker runs in a temporary folder, so
the pool passes that folder with the task (``folder=`` of :meth:`ValidatorPool.submit_cu`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


def spec_reference_files(spec_source: str | None, cu_path: Path) -> set[Path]:
    """Local Python files a ``.cu`` file's results depend on.

    The ``dice-spec`` block's imports (``import ref`` / ``from ref import x`` -> ``ref.py`` beside the file)
    and ``*.py`` string literals (paths it loads), plus ``<stem>.py`` beside the file (KernelBench style).
    Only existing-or-plausible files in the file's folder are returned; nothing is executed.
    """
    folder = cu_path.parent
    found: set[Path] = {folder / f"{cu_path.stem}.py"}
    if spec_source:
        try:
            tree = ast.parse(spec_source)
        except (SyntaxError, ValueError):
            tree = None
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        found.add(folder / (alias.name.split(".")[0] + ".py"))
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(folder / (node.module.split(".")[0] + ".py"))
                elif (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.endswith(".py")
                ):
                    candidate = Path(node.value)
                    found.add(candidate if candidate.is_absolute() else folder / candidate)
    # Standard-library and installed modules (torch, numpy, ...) are not beside the file: keep only those
    # that exist now or are the KernelBench-style sibling (it may be created later).
    sibling = folder / f"{cu_path.stem}.py"
    return {p.resolve() for p in found if p == sibling or p.exists()}


def dependency_stamps(text: str, folder: str | os.PathLike[str] | None, filename: str) -> list[list[object]]:
    """(path, mtime_ns, size) of every local file the ``.cu`` text's dice-spec depends on (-1, -1 for one
    that does not exist): part of every verdict cache key, so a verdict is never served after its reference
    module changed, whether or not a file watcher noticed. Empty without a folder or a dice-spec."""
    if folder is None or "dice-spec" not in text:
        return []
    from dice.cuda_source import parse_document

    spec = parse_document(text).spec
    if spec is None:
        return []
    stamps: list[list[object]] = []
    for path in sorted(spec_reference_files(spec.source, Path(folder) / filename)):
        try:
            st = path.stat()
            stamps.append([str(path), st.st_mtime_ns, st.st_size])
        except OSError:
            stamps.append([str(path), -1, -1])
    return stamps


def dependency_file_stamps(paths: list[str]) -> list[list[object]]:
    """(path, mtime_ns, size) of each file (-1, -1 when missing): what a cached verdict depends on."""
    stamps: list[list[object]] = []
    for path in paths:
        try:
            st = os.stat(path)
            stamps.append([path, st.st_mtime_ns, st.st_size])
        except OSError:
            stamps.append([path, -1, -1])
    return stamps


def stamps_current(stamps: list[list[object]]) -> bool:
    """Whether every file of ``stamps`` (from :func:`dependency_file_stamps`) is unchanged."""
    return all(dependency_file_stamps([str(s[0])])[0] == list(s) for s in stamps)


@contextlib.contextmanager
def spec_folder_imports(folder: str | os.PathLike[str] | None) -> Iterator[None]:
    """Let a dice-spec import modules from ``folder`` (the ``.cu`` file's folder; None: nothing changes).

    The folder goes first on ``sys.path`` for the block. Afterwards it is removed again and every module the
    block loaded from it (``ref.py``, a package ``pkg/``, their submodules) is evicted from ``sys.modules``,
    so the next task in the same worker imports the files' current contents, never a stale copy. Modules
    imported before the block stay, even when their files lie below ``folder`` (an installed package in a
    virtual environment under the user's folder, say). No bytecode is written into the folder meanwhile.
    """
    if folder is None:
        yield
        return
    entry = os.fspath(folder)
    root = Path(entry).resolve()
    before = set(sys.modules)
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    importlib.invalidate_caches()
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
        sys.dont_write_bytecode = dont_write
        loaded = [n for n, m in list(sys.modules.items()) if n not in before and _loaded_from(n, m, root)]
        for name in loaded:
            sys.modules.pop(name, None)
        sys.path_importer_cache.pop(entry, None)
        importlib.invalidate_caches()


def _loaded_from(name: str, module: object, root: Path) -> bool:
    """Whether module ``name`` was found in folder ``root`` as a sys.path entry: its file (or a namespace
    package's folder) lies in ``root`` under its top-level name (``root/ref.py``, ``root/pkg/sub.py``)."""
    file = getattr(module, "__file__", None)
    locations: list[str] = [file] if isinstance(file, str) else []
    if not locations:
        with contextlib.suppress(TypeError):
            locations = [p for p in getattr(module, "__path__", None) or () if isinstance(p, str)]
    top = name.partition(".")[0]
    for location in locations:
        try:
            parts = Path(location).resolve().relative_to(root).parts
        except (ValueError, OSError, RuntimeError):
            continue
        if parts and parts[0].partition(".")[0] == top:
            return True
    return False
