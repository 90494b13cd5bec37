"""The compile half of the ``.cu`` task: NVRTC's fast look at the device code, then nvcc on the whole file
with the project's own flags when that checks more, and what the two together checked.

- NVRTC always runs first (a tenth of a second), on the extracted device code, with the command's include
  folders and macros, instantiating the template kernels the host code launches (name expressions).
- nvcc compiles the whole filled file (:mod:`dice.validator.whole_file`) when it is installed and the file
  has host code, or has a compile command, or templates NVRTC did not instantiate, or (for a file whose
  folder is known) NVRTC failed. Its verdict is the real compiler's, so it decides: NVRTC failing on
  extracted code that nvcc compiles is only a note.
- ``unchecked`` lists what neither type-checked (:mod:`dice.validator.unchecked`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dice.validator.build_flags import BuildFlags, BuildOptions, resolve_build_flags
from dice.validator.compile import CompileResult, nvrtc_compile
from dice.validator.diagnostics import format_diagnostic, include_site_finder
from dice.validator.paths import nvcc_path
from dice.validator.unchecked import (
    branch_probe,
    launch_name_expressions,
    merge_unchecked,
    unchecked_ranges,
)
from dice.validator.verdict import Verdict
from dice.validator.whole_file import nvcc_check_file, project_deps

if TYPE_CHECKING:
    from dice.cuda_source import CudaDocument, DeviceCode
    from dice.validator.context import WorkerContext

MISSING_HEADER_HINT = (
    "no compile command for this file: give one (compile_commands.json, dice.compileCommands) or the "
    "include folders (dice.includePaths)"
)


@dataclass
class CompileChecks:
    """What the compile checks found. ``error``: the compile_error verdict when the code does not compile;
    otherwise ``checked`` says what compiled, ``warnings`` and ``unchecked`` go into the verdict."""

    error: Verdict | None = None
    checked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log: str = ""
    warnings: list[dict[str, Any]] = field(default_factory=list)
    unchecked: list[dict[str, Any]] = field(default_factory=list)
    nvrtc: CompileResult | None = None
    nvrtc_options: list[str] = field(default_factory=list)
    deps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CuFile:
    """The file a ``.cu`` task validates: its text, base name and (when known) path."""

    text: str
    filename: str
    folder: str | None
    build: BuildOptions | None

    @property
    def path(self) -> str | None:
        return os.path.join(self.folder, self.filename) if self.folder else None


def build_flags_for(file: CuFile) -> BuildFlags:
    """The flags of ``file``: from its compile command when its path is known, else from the options."""
    if file.path is not None:
        return resolve_build_flags(file.path, file.build)
    options = file.build or BuildOptions()
    folder = options.workspace_root
    paths = [os.path.join(folder, p) if folder else p for p in options.include_paths]
    includes = [("-I", p) for p in ([folder] if folder else []) + paths]
    return BuildFlags(
        tuple(includes),  # type: ignore[arg-type]
        tuple(f"-D{d}" for d in options.defines if d),
        "c++17",
        directory=folder,
    )


def run_compile_checks(
    ctx: WorkerContext, file: CuFile, device: DeviceCode, doc: CudaDocument
) -> CompileChecks:
    """NVRTC, then nvcc when it checks more (see the module docstring)."""
    flags = build_flags_for(file)
    arch = flags.arch_for(ctx.arch)
    checks = CompileChecks(notes=list(flags.notes))
    folder_opts = [f"-I{file.folder}"] if file.folder else []
    checks.nvrtc_options = folder_opts + flags.nvrtc_options()
    sites = include_site_finder(file.text, file.folder, flags.include_dirs())
    names = launch_name_expressions(doc)
    nvrtc = nvrtc_compile(
        device.source,
        arch=arch,
        line_map=device.line_map,
        display_name=file.filename,
        options=checks.nvrtc_options,
        name_expressions=names,
        include_site=sites,
        timeout_s=ctx.nvrtc_timeout_s,
        memory_bytes=ctx.compile_memory_bytes,
    )
    checks.nvrtc = nvrtc
    if nvrtc.timed_out:  # nvcc would expand the same macros: the check ends here
        checks.error = Verdict(
            "timeout", False, message=f"timed out: {nvrtc.log}\nchecked: nothing", log=nvrtc.log
        )
        return checks
    nvrtc_unchecked = unchecked_ranges(
        doc, nvcc_compiled=False, device=device, nvrtc_names=nvrtc.instantiated
    )
    templates_left = any(u["reason"].startswith("template") for u in nvrtc_unchecked)
    known = file.folder is not None or file.build is not None
    wants_nvcc = device.has_host_code or flags.origin != "none" or templates_left or (known and not nvrtc.ok)
    nvcc = None
    if wants_nvcc and nvcc_path() is not None:
        nvcc = nvcc_check_file(
            file.text,
            flags=flags,
            arch=arch,
            workdir=ctx.task_dir(),
            user_path=file.path,
            display_name=file.filename,
            cache_root=ctx.cache_dir,
            timeout_s=ctx.nvcc_timeout_s,
            memory_bytes=ctx.compile_memory_bytes,
            source_roots=[r for r in (file.build.workspace_root if file.build else None,) if r],
        )
    if nvcc is not None and not nvcc.timed_out:
        checks.deps = project_deps(nvcc.deps)
        return _with_nvcc(checks, file, flags, nvrtc, nvcc, doc)
    if nvcc is not None:
        checks.notes.append(f"whole file not compiled: {nvcc.log}")
    elif wants_nvcc and (device.has_host_code or templates_left):
        checks.notes.append(
            "host code and templates not compiled: nvcc not found (set CUDA_HOME or put nvcc on PATH)"
        )
    if nvrtc.ok:
        inactive = _inactive_branches(ctx, file, device, doc, checks.nvrtc_options, arch)
        nvrtc_unchecked = merge_unchecked(nvrtc_unchecked, inactive)
    return _nvrtc_only(checks, file, nvrtc, nvrtc_unchecked)


def _inactive_branches(
    ctx: WorkerContext,
    file: CuFile,
    device: DeviceCode,
    doc: CudaDocument,
    options: list[str],
    arch: str | None,
) -> list[dict[str, Any]]:
    """The ``#if`` branches NVRTC skipped, when only NVRTC decides (nvcc's own preprocessing says it
    otherwise): a fill in a skipped branch was never type-checked, whatever the verdict. One more NVRTC
    compile, of the device code with a ``#warning`` probe per branch (:func:`branch_probe`), only for
    files that have conditional branches with code in them."""
    probe = branch_probe(device)
    if probe is None:
        return []
    result = nvrtc_compile(
        probe.source,
        arch=arch,
        line_map=probe.line_map,
        display_name=file.filename,
        options=options,
        timeout_s=ctx.nvrtc_timeout_s,
        memory_bytes=ctx.compile_memory_bytes,
    )
    return probe.inactive(result.log, device, doc)


def _nvrtc_summary(result: CompileResult) -> str:
    instantiated = (
        f", {len(result.instantiated)} template launch(es) instantiated" if result.instantiated else ""
    )
    return f"device code with NVRTC ({result.arch}, {result.seconds:.2f} s{instantiated})"


def _nvcc_summary(flags: BuildFlags, result: CompileResult) -> str:
    timing = f"cached, {result.seconds:.1f} s when compiled" if result.cached else f"{result.seconds:.1f} s"
    return f"whole file with nvcc ({flags.description}, {result.arch}, {timing})"


def _first_error(file: CuFile, result: CompileResult, fallback: str) -> str:
    errors = [d for d in result.diagnostics if d["severity"] == "error"]
    if errors:
        return format_diagnostic(file.filename, errors[0])
    for line in result.log.splitlines():
        if "error" in line or "fatal" in line or "out of memory" in line:
            return line.strip()
    return fallback


def _compile_error(
    file: CuFile, result: CompileResult, checked: str, log_head: str, *, hint: bool = False
) -> Verdict:
    message = _first_error(file, result, f"{result.tool} failed")
    missing = "No such file or directory" in result.log or "cannot open source file" in result.log
    if hint and missing:
        message += f"\n{MISSING_HEADER_HINT}"
    return Verdict(
        "compile_error",
        False,
        message=f"{message}\nchecked: {checked}",
        log=(result.log + ("\n\n" + log_head if log_head else "")).strip(),
        diagnostics=result.diagnostics,
    )


def _with_nvcc(
    checks: CompileChecks,
    file: CuFile,
    flags: BuildFlags,
    nvrtc: CompileResult,
    nvcc: CompileResult,
    doc: CudaDocument,
) -> CompileChecks:
    cache = "answered from the cache of unchanged checks, " if nvcc.cached else ""
    timing = f"nvcc: {cache}{nvcc.seconds:.2f} s ({nvcc.arch}); NVRTC: {nvrtc.seconds:.2f} s ({nvrtc.arch})"
    where = _where(flags) + "\n" + timing
    if not nvcc.ok:
        checks.error = _compile_error(
            file,
            nvcc,
            _nvcc_summary(flags, nvcc),
            where,
            hint=flags.origin == "none" and file.path is not None,
        )
        return checks
    checks.checked.append(_nvcc_summary(flags, nvcc))
    if nvrtc.ok:
        checks.checked.append(_nvrtc_summary(nvrtc))
    else:
        checks.checked.append("NVRTC failed on the device code alone (see the log; nvcc decides)")
    seen = {(d["line"], d["message"]) for d in nvcc.diagnostics}
    extra = [
        d for d in nvrtc.diagnostics if d["severity"] == "warning" and (d["line"], d["message"]) not in seen
    ]
    checks.warnings = [d for d in nvcc.diagnostics if d["severity"] == "warning"] + (
        extra if nvrtc.ok else []
    )
    checks.unchecked = unchecked_ranges(doc, nvcc_compiled=True, active=nvcc.active_lines)
    nvrtc_part = nvrtc.log if nvrtc.ok else "NVRTC, on the device code alone (not counted):\n" + nvrtc.log
    checks.log = "\n".join(p for p in (where, nvcc.log, nvrtc_part) if p).strip()
    return checks


def _nvrtc_only(
    checks: CompileChecks, file: CuFile, nvrtc: CompileResult, unchecked: list[dict[str, Any]]
) -> CompileChecks:
    if not nvrtc.ok:
        checks.error = _compile_error(file, nvrtc, _nvrtc_summary(nvrtc), "")
        return checks
    checks.checked.append(_nvrtc_summary(nvrtc))
    checks.warnings = [d for d in nvrtc.diagnostics if d["severity"] == "warning"]
    checks.unchecked = unchecked
    checks.log = nvrtc.log
    return checks


def _where(flags: BuildFlags) -> str:
    """The log's line on the flags: where they came from and, for a project's command, what they were."""
    source = f" from {flags.database}" if flags.database else ""
    borrowed = f" (TU {flags.source_file})" if flags.origin == "borrowed" and flags.source_file else ""
    shown = f"\nflags: {' '.join(flags.nvcc_args())}" if flags.origin != "none" else ""
    notes = "".join(f"\nnote: {n}" for n in flags.notes)
    return f"compile command: {flags.description}{source}{borrowed}{shown}{notes}"
