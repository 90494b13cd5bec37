"""Compile checks: NVRTC (CuPy's bindings, no GPU needed) and nvcc, with errors mapped to file lines."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dice.safeio import format_size
from dice.validator.diagnostics import (
    FileMapping,
    outside_source_checker,
    parse_compiler_output,
    redact_outside_sources,
    to_diagnostics,
)
from dice.validator.limits import (
    NVCC_TIMEOUT_S,
    NVRTC,
    NVRTC_TIMEOUT_S,
    Outcome,
    compile_memory_bytes,
    run_command,
)
from dice.validator.paths import cuda_include_dirs, default_arch, nvcc_path

# "<file>(<1-based line>): error: <text>" from NVRTC and nvcc (also "catastrophic error", "warning #177-D").
COMPILER_LINE = re.compile(
    r"^(?P<file>[^\n()]*)\((?P<line>\d+)\):\s*(?P<severity>catastrophic error|error|warning|remark)"
    r"(?P<code>\s*#[\w-]+)?\s*:?\s*(?P<message>.*)$",
    re.MULTILINE,
)

NVRTC_STD_OPTIONS: tuple[str, ...] = ("-std=c++17",)
NVRTC_PROGRAM = "dice_device.cu"  # the name NVRTC gives the in-memory program in its messages


@dataclass
class CompileResult:
    ok: bool
    log: str
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    tool: str = "nvrtc"
    arch: str = ""
    instantiated: list[str] = field(default_factory=list)  # NVRTC name expressions that compiled
    deps: list[str] = field(default_factory=list)  # files nvcc read (its dependency output)
    cached: bool = False  # answered from the on-disk cache of unchanged checks
    timed_out: bool = False
    # nvcc: 0-based lines of the user's file that reached the compiler (None: unknown)
    active_lines: list[int] | None = None


def map_compiler_log(
    log: str,
    line_map: Sequence[int] | None,
    display_name: str,
    *,
    include_site: Callable[[str], int | None] | None = None,
    source: str = "nvrtc",
) -> tuple[str, list[dict[str, Any]]]:
    """Rewrite compiler line references to the user's file and collect diagnostics.

    ``line_map[i]`` is the 0-based file line of line ``i`` of the compiled source. A reference to a line
    outside the map (a header, a preamble) keeps its original file name and line.
    Returns the rewritten log (``display_name(<1-based line>): error: ...``) and diagnostics with a 0-based
    ``line`` (and ``column``, ``source``, ``notes``; an error in a header lands on the user's ``#include``
    of it when ``include_site`` finds one, with the header's place in ``header``).
    """

    def own(name: str | None) -> bool:
        return (
            not name
            or Path(name).name in (display_name, Path(display_name).name)
            or name.endswith(("kernel.cu", "dice_device.cu"))
        )

    def mapped(line1: int) -> int | None:
        if line_map is None:
            return line1 - 1
        return line_map[line1 - 1] if 0 <= line1 - 1 < len(line_map) else None

    def rewrite(match: re.Match[str]) -> str:
        name, line0 = match.group("file"), int(match.group("line")) - 1
        target = mapped(line0 + 1) if own(name) else None
        if target is not None:
            name, line0 = display_name, target
        code = match.group("code") or ""
        return f"{name}({line0 + 1}): {match.group('severity')}{code}: {match.group('message')}"

    def rewrite_site(match: re.Match[str]) -> str:
        target = mapped(int(match.group("line"))) if own(match.group("file")) else None
        if target is None:
            return match.group(0)
        return f"at line {target + 1} of {display_name}"

    raw = parse_compiler_output(log, edg_source=source)
    mapping = FileMapping(own, display_name, line_map, include_site)
    diagnostics = to_diagnostics(raw, mapping)
    rewritten = COMPILER_LINE.sub(rewrite, log)
    rewritten = _AT_LINE.sub(rewrite_site, rewritten)
    return rewritten, diagnostics


_AT_LINE = re.compile(r"at line (?P<line>\d+) of (?P<file>[^\s\"]+)")


MISSING_HEADER = re.compile(r'cannot open source file "(?P<name>[^"]+)"')
# Headers of the torch extension API: host-only, unknown to NVRTC. Compile checks of extension sources give
# NVRTC empty stand-ins for them (the host functions that need them are not part of the device code).
TORCH_HEADER_PREFIXES: tuple[str, ...] = ("torch/", "ATen/", "c10/", "pybind11/", "caffe2/")


def nvrtc_compile(
    source: str,
    *,
    arch: str | None = None,
    line_map: Sequence[int] | None = None,
    display_name: str = "kernel.cu",
    options: Sequence[str] = (),
    stub_header_prefixes: Sequence[str] = (),
    name_expressions: Sequence[str] = (),
    include_site: Callable[[str], int | None] | None = None,
    timeout_s: float = NVRTC_TIMEOUT_S,
    memory_bytes: int | None = None,
) -> CompileResult:
    """Compile device code to a cubin with NVRTC; works on a machine without a GPU.

    Includes whose name starts with one of ``stub_header_prefixes`` resolve to empty headers.
    ``name_expressions`` (``k<float, 8>``) instantiate template kernels; one NVRTC cannot parse (an
    argument the device code does not define) is left out and the compile retried:
    :attr:`CompileResult.instantiated` lists those that were used. ``options`` may carry the project's
    ``-I``/``-D``/``-std``; the C++ standard is never below C++17 (libcu++ needs it).

    Each compile runs in this process's NVRTC child (:class:`dice.validator.limits.NvrtcProcess`):
    ``timeout_s`` bounds all of them together (then :attr:`CompileResult.timed_out`), ``memory_bytes`` the
    child's address space (None: :func:`~dice.validator.limits.compile_memory_bytes`). Source lines of
    files outside the include path that the log would quote are redacted (:func:`redact_outside_sources`).
    """
    arch = arch or default_arch()
    std = [o for o in options if o.startswith("-std=")]
    base = [
        f"--gpu-architecture=sm_{arch}",
        *nvrtc_std_options(std),
        *(o for o in options if not o.startswith("-std=")),
    ]
    opts = base + [f"-I{d}" for d in cuda_include_dirs()]
    start = time.perf_counter()
    stubs: list[str] = []
    names = list(dict.fromkeys(name_expressions))
    memory = compile_memory_bytes() if memory_bytes is None else memory_bytes
    for _ in range(32 + len(names)):
        left = timeout_s - (time.perf_counter() - start)
        request = {"source": source, "options": opts, "stubs": stubs, "names": names}
        outcome = NVRTC.compile(request, timeout_s=max(left, 0.01), memory_bytes=memory)
        if outcome.status != "ok":
            return _nvrtc_failure(outcome, timeout_s, memory, time.perf_counter() - start, arch)
        ok, log = bool(outcome.value["ok"]), str(outcome.value["log"])
        bad = _bad_name_expressions(log, names) if not ok else []
        if bad:
            names = [n for n in names if n not in bad]
            continue
        missing = MISSING_HEADER.search(log) if not ok else None
        if (
            missing is None
            or not missing.group("name").startswith(tuple(stub_header_prefixes))
            or missing.group("name") in stubs
        ):
            break
        stubs.append(missing.group("name"))
    log = log.rstrip("\x00").strip()
    if "out of memory" in log:
        log += f"\n(NVRTC may use {format_size(memory)} of address space here)"
    outside = outside_source_checker(
        [o[2:] for o in opts if o.startswith("-I") and len(o) > 2],
        cwd=os.getcwd(),
        own=[NVRTC_PROGRAM, display_name, *stubs],
    )
    log = redact_outside_sources(log, outside)
    if stubs:
        log = (f"(empty stand-ins used for host-only headers: {', '.join(stubs)})\n" + log).strip()
    log, diagnostics = map_compiler_log(log, line_map, display_name, include_site=include_site)
    result = CompileResult(ok, log, diagnostics, time.perf_counter() - start, "nvrtc", f"sm_{arch}")
    result.instantiated = names
    return result


def _nvrtc_failure(
    outcome: Outcome, timeout_s: float, memory: int, seconds: float, arch: str
) -> CompileResult:
    """The result of an NVRTC compile that did not answer: killed at the deadline, or its process died."""
    if outcome.status == "timeout":
        log = (
            f"NVRTC did not finish within {timeout_s:g} s and was stopped (a macro or #include that "
            "expands without end?)"
        )
    else:
        log = f"NVRTC failed: {outcome.detail} (memory limit {format_size(memory)})"
    result = CompileResult(False, log, [], seconds, "nvrtc", f"sm_{arch}")
    result.timed_out = outcome.status == "timeout"
    return result


def nvrtc_std_options(requested: Sequence[str]) -> list[str]:
    """``-std=c++17`` unless the project asks for a newer standard."""
    newest = requested[-1] if requested else ""
    digits = re.search(r"(\d+)$", newest)
    if digits and int(digits.group(1)) in (20, 23, 26):
        return [newest]
    return list(NVRTC_STD_OPTIONS)


_NAME_MAP_ERROR = re.compile(r'Input name expression was: "(?P<name>[^"]*)"')


def _bad_name_expressions(log: str, names: Sequence[str]) -> list[str]:
    """The name expressions NVRTC could not parse (errors in ``__nv_name_map``), all of them when it does
    not say which."""
    if "__nv_name_map" not in log:
        return []
    said = {re.sub(r"\s+", "", m.group("name")) for m in _NAME_MAP_ERROR.finditer(log)}
    bad = [n for n in names if re.sub(r"\s+", "", n) in said]
    return bad or list(names)


def nvcc_compile_check(
    text: str,
    *,
    workdir: Path,
    display_name: str = "kernel.cu",
    arch: str | None = None,
    timeout_s: float = NVCC_TIMEOUT_S,
    memory_bytes: int | None = None,
) -> CompileResult | None:
    """Compile a whole file with host code (``main``) to an object with nvcc; None when nvcc is absent.
    nvcc runs under :func:`dice.validator.limits.run_command` (its whole process tree killed at
    ``timeout_s``, each process capped at ``memory_bytes``)."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    arch = arch or default_arch()
    src = workdir / "kernel.cu"
    src.write_text(text, encoding="utf-8")
    cmd = [nvcc, "-c", "-std=c++17", f"-arch=sm_{arch}", "-o", str(workdir / "kernel.o"), str(src)]
    env = {**os.environ, "LC_ALL": "C"}
    proc = run_command(cmd, cwd=workdir, env=env, timeout_s=timeout_s, memory_bytes=memory_bytes)
    if proc.returncode is None:
        result = CompileResult(
            False, f"nvcc took longer than {timeout_s:g} s", [], proc.seconds, "nvcc", f"sm_{arch}"
        )
        result.timed_out = True
        return result
    outside = outside_source_checker([str(workdir)], cwd=str(workdir), own=[str(src), display_name])
    log = redact_outside_sources((proc.stdout + proc.stderr).strip(), outside).replace(str(src), display_name)
    log, diagnostics = map_compiler_log(log, None, display_name)
    return CompileResult(proc.returncode == 0, log, diagnostics, proc.seconds, "nvcc", f"sm_{arch}")
