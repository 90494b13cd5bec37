"""The whole file, compiled with nvcc as its project compiles it (:mod:`dice.validator.build_flags`).

The filled text goes to a temporary file (never the user's folder, never the user's file) whose first line
``#line 1 "<user's path>"`` makes every message name the user's file and line; the user's folder is the first
quote folder, so ``#include "common.h"`` and ``"../x.h"`` resolve as they do in place; nvcc runs in the
command's ``directory``. Host code and the templates it instantiates are checked with the device code.

nvcc has no ``-fsyntax-only`` for device code: cudafe++ and cicc (EDG) type-check host and device code, gcc
re-reads the host side, ptxas assembles the PTX (inline PTX errors show only there). The cheapest check that
keeps all four, measured on realproj (``benchmarks/results/realproj_compile.md``), compiles one real
architecture (``-gencode arch=compute_XX,code=sm_XX``) with every optimiser off (``-O0 -Xcicc -O0 -Xptxas
-O0``), no fatbinary compression, and ``-fsyntax-only`` for the host compiler's pass: 0-42% faster than the
project's own command (most on TUs with heavy device code). A check whose text, flags and every file it read
(nvcc's ``-MD`` output) are unchanged is answered from an on-disk cache; with ``DICE_CCACHE=1`` and ccache on
PATH, nvcc runs under ccache instead (it then compiles the host object, which ccache needs).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dice.safeio import format_size
from dice.validator.build_flags import BuildFlags
from dice.validator.compile import CompileResult
from dice.validator.diagnostics import (
    FileMapping,
    include_site_finder,
    outside_source_checker,
    parse_compiler_output,
    ptx_line_finder,
    redact_outside_sources,
    rewrite_paths,
    to_diagnostics,
)
from dice.validator.limits import (
    MEMORY_ENV,
    NVCC_TIMEOUT_S,
    compile_memory_bytes,
    run_command,
)
from dice.validator.paths import nvcc_path, pip_cuda_include_dir, source_hash, toolkit_include_dir

CHECK_FLAGS: tuple[str, ...] = ("-O0", "-Xcicc", "-O0", "-Xptxas", "-O0", "-compress-mode=none", "-lineinfo")
HOST_SYNTAX_ONLY: tuple[str, ...] = ("-Xcompiler", "-fsyntax-only")
CACHE_VERSION = "whole-file-3"  # 3: logs redact lines of files outside the include path
MAX_CACHE_ENTRIES = 4000
_SYSTEM_PREFIXES = ("/usr/include", "/usr/lib", "/usr/local/cuda", "/opt/cuda")


def extra_system_includes(flags: BuildFlags) -> list[str]:
    """The pip CUDA headers as ``-isystem`` after everything (so after the toolkit's own folder, which nvcc
    passes as ``-I``), when the toolkit lacks a header they have (``cublas_v2.h``) and the command does not
    name them already."""
    pip = pip_cuda_include_dir()
    toolkit = toolkit_include_dir()
    if pip is None or any(os.path.realpath(p) == os.path.realpath(pip) for p in flags.include_dirs()):
        return []
    if toolkit is not None and os.path.isfile(os.path.join(toolkit, "cublas_v2.h")):
        return []
    return ["-isystem", pip]


@dataclass(frozen=True)
class _Limits:
    """What bounds one nvcc run: its deadline, each process's address space (None: the default), and the
    folders beside the include path whose lines its log may quote."""

    timeout_s: float
    memory_bytes: int | None
    roots: tuple[str, ...]


def use_ccache() -> str | None:
    if os.environ.get("DICE_CCACHE", "").strip() not in ("1", "true", "yes"):
        return None
    return shutil.which("ccache")


def nvcc_check_file(
    text: str,
    *,
    flags: BuildFlags,
    arch: str,
    workdir: Path,
    user_path: str | None = None,
    display_name: str = "kernel.cu",
    cache_root: Path | None = None,
    timeout_s: float = NVCC_TIMEOUT_S,
    memory_bytes: int | None = None,
    source_roots: Sequence[str] = (),
) -> CompileResult | None:
    """Compile the whole ``text`` as the user's file with nvcc; None when nvcc is absent.

    ``user_path``: the user's file (its folder goes first on the quote path; messages name it as
    ``display_name``); ``flags`` the resolved command; ``arch`` the one architecture (``90``, ``90a``);
    ``cache_root``: where verdicts of unchanged checks are kept (None: no cache). nvcc and every compiler
    it starts are killed at ``timeout_s`` and capped at ``memory_bytes`` of address space each
    (:func:`dice.validator.limits.run_command`). The log quotes source lines only of files in the user's
    folder, the command's include folders, ``source_roots`` (the workspace) and the system's headers."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    user_path = os.path.abspath(user_path) if user_path else None
    named = user_path or display_name
    body = text[1:] if text.startswith("\ufeff") else text
    source = f'#line 1 "{_c_string(named)}"\n{body}'
    cwd = _cwd(flags, user_path, workdir)
    ccache = use_ccache()
    base = _command(nvcc, flags, arch, user_path, ccache)
    key = source_hash(CACHE_VERSION, nvcc, str(_stamp(nvcc)), json.dumps(base), source, display_name, cwd)
    cached = _cache_get(cache_root, key)
    if cached is not None:
        return cached
    tmp = Path(tempfile.mkdtemp(prefix="nvcc-", dir=workdir))
    try:
        limits = _Limits(timeout_s, memory_bytes, tuple(source_roots))
        result = _run(nvcc, base, source, tmp, cwd, user_path, display_name, text, flags, limits, arch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if result.ok or result.diagnostics:
        _cache_put(cache_root, key, result)
    return result


def _c_string(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')


def _cwd(flags: BuildFlags, user_path: str | None, workdir: Path) -> str:
    for candidate in (flags.directory, os.path.dirname(user_path) if user_path else None):
        if candidate and os.path.isdir(candidate):
            return candidate
    return str(workdir)


def _command(nvcc: str, flags: BuildFlags, arch: str, user_path: str | None, ccache: str | None) -> list[str]:
    """Everything but the files: compiler, quote folder, the project's flags, the check's own flags."""
    cmd = [ccache, nvcc] if ccache else [nvcc]
    cmd += ["-x", "cu"]
    if user_path:
        folder = os.path.dirname(user_path)
        cmd.append(f"-I{folder}" if "," in folder else f"-Xcompiler=-iquote,{folder}")
    cmd += flags.nvcc_args() + extra_system_includes(flags)
    cmd += ["-gencode", f"arch=compute_{arch},code=sm_{arch}", *CHECK_FLAGS]
    if not ccache:
        cmd += HOST_SYNTAX_ONLY  # ccache needs the object it caches
    return cmd


def _run(
    nvcc: str,
    base: list[str],
    source: str,
    tmp: Path,
    cwd: str,
    user_path: str | None,
    display_name: str,
    text: str,
    flags: BuildFlags,
    limits: _Limits,
    arch: str,
) -> CompileResult:
    src = tmp / display_name
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(source)
    keep = tmp / "keep"
    keep.mkdir()
    cmd = [*base, "--keep", "--keep-dir", str(keep), "-MD", "-MF", str(tmp / "deps.d")]
    cmd += ["-c", str(src), "-o", str(tmp / "out.o")]
    env = {**os.environ, "LC_ALL": "C", "TMPDIR": str(tmp)}
    proc = run_command(cmd, cwd=cwd, env=env, timeout_s=limits.timeout_s, memory_bytes=limits.memory_bytes)
    seconds = proc.seconds
    if proc.returncode is None:
        message = (
            f"nvcc took longer than {limits.timeout_s:g} s and was stopped with the compilers it started"
        )
        return CompileResult(False, message, [], seconds, "nvcc", f"sm_{arch}", timed_out=True)
    folder = os.path.dirname(user_path) if user_path else None
    outside = outside_source_checker(
        [p for p in (folder, *flags.include_dirs(), *limits.roots) if p],
        cwd=cwd,
        own=[str(src), user_path or "", display_name],
    )
    raw_log = redact_outside_sources((proc.stdout + "\n" + proc.stderr).strip(), outside)
    own = {os.path.normpath(p) for p in (str(src), user_path) if p}

    def is_user(path: str | None) -> bool:
        if not path:
            return False
        if user_path is None and path == display_name:  # the #line name when the file has no folder
            return True
        full = path if os.path.isabs(path) else os.path.join(cwd, path)
        return os.path.normpath(full) in own

    mapping = FileMapping(
        is_user,
        display_name,
        include_site=include_site_finder(text, folder, flags.include_dirs()),
        ptx_line=ptx_line_finder(is_user, str(keep)),
    )
    names = {str(src): display_name, **({user_path: display_name} if user_path else {})}

    def clean(message: str) -> str:
        return rewrite_paths(message, names).replace(str(tmp) + os.sep, "")

    diagnostics = to_diagnostics(parse_compiler_output(raw_log, edg_source="nvcc"), mapping)
    for d in diagnostics:
        d["message"] = clean(d["message"])
        d["notes"] = [clean(n) for n in d["notes"]]
    log = clean(raw_log)
    if proc.returncode != 0 and "out of memory" in log:
        memory = compile_memory_bytes() if limits.memory_bytes is None else limits.memory_bytes
        log += f"\n(each compiler process may use {format_size(memory)} of address space here; {MEMORY_ENV})"
    result = CompileResult(proc.returncode == 0, log, diagnostics, seconds, "nvcc", f"sm_{arch}")
    result.deps = _read_deps(tmp / "deps.d", {str(src)})
    if result.ok:
        result.active_lines = sorted(active_lines(sorted(keep.glob("*.ii")), is_user))
    return result


_MARKER = re.compile(r'^#\s*(\d+)\s+"((?:[^"\\]|\\.)*)"')


def active_lines(preprocessed: list[Path], is_user: Callable[[str | None], bool]) -> set[int]:
    """0-based lines of the user's file that produced code in any of nvcc's preprocessed outputs (the
    device pass and the host pass): a line absent from all of them was in a false ``#if`` branch."""
    active: set[int] = set()
    for path in preprocessed:
        current: int | None = None
        names: dict[str, bool] = {}
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    m = _MARKER.match(line) if line.startswith("#") else None
                    if m:
                        name = m.group(2).replace("\\\\", "\\")
                        if name not in names:
                            names[name] = is_user(name)
                        current = int(m.group(1)) - 1 if names[name] else None
                        continue
                    if current is not None:
                        if line.strip():
                            active.add(current)
                        current += 1
        except OSError:
            continue
    return active


def _read_deps(path: Path, exclude: set[str]) -> list[str]:
    """The files a Makefile rule from ``-MD`` names (the object's prerequisites)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    text = text.replace("\\\n", " ")
    _, _, prerequisites = text.partition(": ")
    deps: list[str] = []
    for token in prerequisites.replace("\\ ", "\x00").split():
        dep = token.replace("\x00", " ")
        if dep not in exclude and dep not in deps:
            deps.append(dep)
    return deps


def project_deps(deps: list[str]) -> list[str]:
    """The deps outside the system and CUDA folders (what a user may edit between two checks)."""
    skip = [p for p in (pip_cuda_include_dir(), toolkit_include_dir()) if p]
    out = []
    for dep in deps:
        real = os.path.realpath(dep)
        if real.startswith(_SYSTEM_PREFIXES) or any(real.startswith(os.path.realpath(s)) for s in skip):
            continue
        if "site-packages" in real or "dist-packages" in real:
            continue
        out.append(dep)
    return out


def _stamp(path: str) -> list[int]:
    try:
        st = os.stat(path)
        return [st.st_mtime_ns, st.st_size]
    except OSError:
        return [-1, -1]


def stamps_unchanged(stamps: list[list[Any]]) -> bool:
    return all(_stamp(str(path)) == [mtime, size] for path, mtime, size in stamps)


def _cache_get(root: Path | None, key: str) -> CompileResult | None:
    if root is None:
        return None
    path = root / "nvcc" / key[:2] / f"{key}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not stamps_unchanged(entry.get("stamps", [])):
        return None
    result = CompileResult(
        bool(entry["ok"]), entry["log"], entry["diagnostics"], float(entry["seconds"]), "nvcc", entry["arch"]
    )
    result.deps = [s[0] for s in entry.get("stamps", [])]
    result.active_lines = entry.get("active_lines")
    result.cached = True
    with contextlib.suppress(OSError):
        os.utime(path)
    return result


def _cache_put(root: Path | None, key: str, result: CompileResult) -> None:
    if root is None:
        return
    folder = root / "nvcc" / key[:2]
    entry = {
        "ok": result.ok,
        "log": result.log,
        "diagnostics": result.diagnostics,
        "seconds": result.seconds,
        "arch": result.arch,
        "active_lines": result.active_lines,
        "stamps": [[d, *_stamp(d)] for d in result.deps],
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(tmp, folder / f"{key}.json")
        _prune(root / "nvcc")
    except OSError:
        pass


def _prune(root: Path) -> None:
    """Keep the cache to :data:`MAX_CACHE_ENTRIES` files, dropping the least recently used."""
    if (hash(time.time_ns()) % 50) != 0:
        return
    files = sorted(root.glob("*/*.json"), key=lambda p: p.stat().st_mtime)
    for path in files[: max(0, len(files) - MAX_CACHE_ENTRIES)]:
        with contextlib.suppress(OSError):
            path.unlink()
