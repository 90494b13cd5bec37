"""Compile checks: NVRTC (CuPy's bindings, no GPU needed) and nvcc, with errors mapped to file lines."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dice.validator.paths import cuda_include_dirs, default_arch, nvcc_path

# "<file>(<1-based line>): error: <text>" from NVRTC and nvcc (also "catastrophic error", "warning #177-D").
COMPILER_LINE = re.compile(
    r"^(?P<file>[^\n()]*)\((?P<line>\d+)\):\s*(?P<severity>catastrophic error|error|warning|remark)"
    r"(?P<code>\s*#[\w-]+)?\s*:?\s*(?P<message>.*)$",
    re.MULTILINE,
)

NVRTC_STD_OPTIONS: tuple[str, ...] = ("-std=c++17",)


@dataclass
class CompileResult:
    ok: bool
    log: str
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    tool: str = "nvrtc"
    arch: str = ""


def map_compiler_log(
    log: str, line_map: Sequence[int] | None, display_name: str
) -> tuple[str, list[dict[str, Any]]]:
    """Rewrite compiler line references to the user's file and collect diagnostics.

    ``line_map[i]`` is the 0-based file line of line ``i`` of the compiled source. A reference to a line
    outside the map (a header, a preamble) keeps its original file name and line.
    Returns the rewritten log (``display_name(<1-based line>): error: ...``) and diagnostics with a 0-based
    ``line``.
    """
    diagnostics: list[dict[str, Any]] = []

    def rewrite(match: re.Match[str]) -> str:
        line0 = int(match.group("line")) - 1
        name = match.group("file")
        own_file = (
            not name
            or Path(name).name in (display_name, Path(display_name).name)
            or name.endswith(("kernel.cu", "dice_device.cu"))
        )
        if own_file and line_map is not None:
            if 0 <= line0 < len(line_map):
                line0 = line_map[line0]
            else:
                own_file = False
        severity = "warning" if match.group("severity") in ("warning", "remark") else "error"
        if own_file:
            diagnostics.append(
                {"line": line0, "severity": severity, "message": match.group("message").strip()}
            )
            name = display_name
        code = match.group("code") or ""
        return f"{name}({line0 + 1}): {match.group('severity')}{code}: {match.group('message')}"

    return COMPILER_LINE.sub(rewrite, log), diagnostics


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
) -> CompileResult:
    """Compile device code to a cubin with NVRTC; works on a machine without a GPU.

    Includes whose name starts with one of ``stub_header_prefixes`` resolve to empty headers.
    """
    from cupy_backends.cuda.libs import nvrtc

    arch = arch or default_arch()
    opts = [f"--gpu-architecture=sm_{arch}", *NVRTC_STD_OPTIONS, *options]
    opts += [f"-I{d}" for d in cuda_include_dirs()]
    start = time.perf_counter()
    stubs: list[str] = []
    for _ in range(32):
        prog = nvrtc.createProgram(source, "dice_device.cu", [b""] * len(stubs), [s.encode() for s in stubs])
        try:
            try:
                nvrtc.compileProgram(prog, opts)
                ok = True
            except nvrtc.NVRTCError:
                ok = False
            log = nvrtc.getProgramLog(prog) or ""
        finally:
            nvrtc.destroyProgram(prog)
        missing = MISSING_HEADER.search(log) if not ok else None
        if (
            missing is None
            or not missing.group("name").startswith(tuple(stub_header_prefixes))
            or missing.group("name") in stubs
        ):
            break
        stubs.append(missing.group("name"))
    log = log.rstrip("\x00").strip()
    if stubs:
        log = (f"(empty stand-ins used for host-only headers: {', '.join(stubs)})\n" + log).strip()
    log, diagnostics = map_compiler_log(log, line_map, display_name)
    return CompileResult(ok, log, diagnostics, time.perf_counter() - start, "nvrtc", f"sm_{arch}")


def nvcc_compile_check(
    text: str,
    *,
    workdir: Path,
    display_name: str = "kernel.cu",
    arch: str | None = None,
    timeout_s: float = 300.0,
) -> CompileResult | None:
    """Compile a whole file with host code (``main``) to an object with nvcc; None when nvcc is absent."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    arch = arch or default_arch()
    src = workdir / "kernel.cu"
    src.write_text(text, encoding="utf-8")
    cmd = [nvcc, "-c", "-std=c++17", f"-arch=sm_{arch}", "-o", str(workdir / "kernel.o"), str(src)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        return CompileResult(
            False, f"nvcc took longer than {timeout_s:.0f} s", [], timeout_s, "nvcc", f"sm_{arch}"
        )
    log = (proc.stdout + proc.stderr).strip().replace(str(src), display_name)
    log, diagnostics = map_compiler_log(log, None, display_name)
    return CompileResult(
        proc.returncode == 0, log, diagnostics, time.perf_counter() - start, "nvcc", f"sm_{arch}"
    )
