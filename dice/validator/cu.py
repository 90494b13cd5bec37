"""The ``.cu`` path, run inside a worker: NVRTC compile with errors on the file's own lines, nvcc for files
with host code, and with a ``dice-spec`` plus a GPU: inputs, launch, reference, comparison and timing."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dice.validator.compile import NVRTC_STD_OPTIONS, nvcc_compile_check, nvrtc_compile
from dice.validator.paths import cuda_include_dirs, default_arch
from dice.validator.runtime_guards import Replaced, monkey_patch
from dice.validator.spec_files import spec_folder_imports
from dice.validator.verdict import FLAG_NOT_RUN, Verdict, speedup_flags

if TYPE_CHECKING:
    from dice.validator.context import WorkerContext
    from dice.validator.gpu import Timing

DEFAULT_ATOL = 1e-2
DEFAULT_RTOL = 1e-2
CU_WARMUP = 3
CU_TRIALS = 30  # the editor waits on these; KernelBench uses 100


def run_cu(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    from dice.cuda_source import extract_device_code, parse_document

    text: str = task["text"]
    filename: str = task.get("filename") or "kernel.cu"
    folder: str | None = task.get("folder") or None
    run: bool = bool(task.get("run", True))
    arch = ctx.arch or default_arch()
    ctx.phase("build")
    device = extract_device_code(text)
    doc = parse_document(text)
    kernels = [f.name for f in doc.functions if f.kind == "global" and f.name]
    checked: list[str] = []
    notes: list[str] = []

    if device.has_host_code:
        host = nvcc_compile_check(text, workdir=ctx.task_dir(), display_name=filename, arch=arch)
        if host is None:
            notes.append("host code not compiled: nvcc not found (set CUDA_HOME or put nvcc on PATH)")
        elif not host.ok:
            return Verdict(
                "compile_error",
                False,
                message=_first_error(host.log, "nvcc failed"),
                log=host.log,
                diagnostics=host.diagnostics,
            ), False
        else:
            checked.append(f"whole file with nvcc ({host.arch}, {host.seconds:.1f} s)")

    result = nvrtc_compile(device.source, arch=arch, line_map=device.line_map, display_name=filename)
    if not result.ok:
        return Verdict(
            "compile_error",
            False,
            message=_first_error(result.log, "NVRTC failed"),
            log=result.log,
            diagnostics=result.diagnostics,
        ), False
    checked.append(f"device code with NVRTC ({result.arch}, {result.seconds:.2f} s)")
    warnings = [d for d in result.diagnostics if d["severity"] == "warning"]

    def compiled_only(reason: str) -> tuple[Verdict, bool]:
        message = "compiled: " + "; ".join(checked) + f". Not run: {reason}."
        if notes:
            message += " " + " ".join(notes) + "."
        return Verdict(
            "compiled",
            True,
            None,
            message=message,
            log=result.log,
            flags=[FLAG_NOT_RUN],
            diagnostics=warnings,
        ), False

    if doc.spec is None:
        return compiled_only(
            "the file has no dice-spec block (add one with inputs/reference/launch to run it)"
        )
    if not run:
        return compiled_only("compile-only validation was requested")
    if not ctx.gpu:
        return compiled_only("no CUDA GPU on this machine")

    ctx.acquire_gpu()
    return _run_spec(ctx, device.source, kernels, doc.spec.source, filename, checked, result.log, folder)


@dataclass
class _SpecRun:
    """A dice-spec that ran correctly and was timed."""

    atol: float
    rtol: float
    max_abs_err: float | None
    ref_t: Timing
    new_t: Timing


class _Stage:
    """What the run is doing now, for the message when it fails."""

    def __init__(self, name: str) -> None:
        self.name = name


def _run_spec(
    ctx: WorkerContext,
    source: str,
    kernels: list[str],
    spec_source: str,
    filename: str,
    checked: list[str],
    compile_log: str,
    folder: str | None = None,
) -> tuple[Verdict, bool]:
    # imported outside the try, as before: a broken CuPy or torch is the validator's error, not the spec's
    import cupy  # noqa: F401
    import torch  # noqa: F401

    import dice.validator.gpu  # noqa: F401

    stage = _Stage("compiling the module with CuPy")
    try:
        with spec_folder_imports(folder):
            outcome = _check_spec(source, kernels, spec_source, filename, compile_log, stage)
    except Exception as exc:  # noqa: BLE001 - the kernel or the spec failed: that is the verdict
        # A CUDA fault (illegal address ...) poisons the context: the worker must be replaced.
        return Verdict(
            "runtime_error",
            True,
            message=f"runtime error while {stage.name}: {type(exc).__name__}: {exc}",
            log=traceback.format_exc(),
        ), True
    if isinstance(outcome, Verdict):
        return outcome, False
    patched = monkey_patch(Replaced("the run", ctx.integrity.violations()))
    if patched is not None:
        return Verdict("rejected", True, message="monkey_patch: " + patched), True
    return _correct_verdict(ctx, outcome, checked, compile_log), False


def _check_spec(
    source: str, kernels: list[str], spec_source: str, filename: str, compile_log: str, stage: _Stage
) -> _SpecRun | Verdict:
    """Compile the module, execute the dice-spec, compare ``launch`` with ``reference`` and time both; the
    verdict when the spec is incomplete or the output wrong. ``stage`` follows the steps."""
    import cupy
    import torch

    from dice.validator.gpu import L2Flusher, TorchModule, compare_outputs, time_cuda

    options = (*NVRTC_STD_OPTIONS, *(f"-I{d}" for d in cuda_include_dirs()))
    raw = cupy.RawModule(code=source, options=options, backend="nvrtc", name_expressions=kernels or None)
    module = TorchModule(raw)
    stage.name = "executing the dice-spec block"
    namespace: dict[str, Any] = {"__name__": "dice_spec"}
    exec(compile(spec_source, f"{filename} (dice-spec)", "exec"), namespace)  # noqa: S102 - user's own spec
    missing = [n for n in ("inputs", "reference", "launch") if not callable(namespace.get(n))]
    if missing:
        return Verdict(
            "runtime_error",
            True,
            message="dice-spec must define inputs(), reference(*inputs) and "
            f"launch(module, *inputs); missing: {', '.join(missing)}",
        )
    atol = float(namespace.get("atol", DEFAULT_ATOL))
    rtol = float(namespace.get("rtol", DEFAULT_RTOL))
    stage.name = "building inputs"
    torch.manual_seed(0)
    ref_inputs = list(namespace["inputs"]())
    torch.manual_seed(0)
    new_inputs = list(namespace["inputs"]())
    stage.name = "running reference()"
    ref_out = namespace["reference"](*ref_inputs)
    stage.name = "running launch()"
    new_out = namespace["launch"](module, *new_inputs)
    torch.cuda.synchronize()
    if new_out is None:
        return Verdict(
            "runtime_error",
            True,
            message="launch(module, *inputs) returned None: return the "
            "output tensor(s) so they can be compared with reference()",
        )
    stage.name = "comparing"
    cmp = compare_outputs(new_out, ref_out, atol=atol, rtol=rtol)
    if not cmp.correct:
        return Verdict(
            "incorrect",
            True,
            False,
            max_abs_err=cmp.max_abs_err,
            message=f"incorrect: {cmp.message}",
            log=compile_log,
        )
    stage.name = "timing"
    flush = L2Flusher()
    ref_t = time_cuda(
        lambda *a: namespace["reference"](*a), [ref_inputs], warmup=CU_WARMUP, trials=CU_TRIALS, flush=flush
    )
    new_t = time_cuda(
        lambda *a: namespace["launch"](module, *a),
        [new_inputs],
        warmup=CU_WARMUP,
        trials=CU_TRIALS,
        flush=flush,
    )
    return _SpecRun(atol, rtol, cmp.max_abs_err, ref_t, new_t)


def _correct_verdict(ctx: WorkerContext, run: _SpecRun, checked: list[str], compile_log: str) -> Verdict:
    ref_t, new_t = run.ref_t, run.new_t
    speedup = ref_t.mean_ms / new_t.mean_ms if new_t.mean_ms > 0 else None
    flags: list[str] = []
    message = (
        f"correct (atol={run.atol:g}, rtol={run.rtol:g}); {speedup:.2f}x vs reference "
        f"({ref_t.mean_ms:.4f} ms -> {new_t.mean_ms:.4f} ms, mean of {CU_TRIALS} after {CU_WARMUP} warm-up)"
    )
    extra_flags, note = speedup_flags(speedup)
    flags += extra_flags
    message += note
    log = (
        f"checked: {'; '.join(checked)}\n"
        f"reference: mean {ref_t.mean_ms:.5f} ms, median {ref_t.median_ms:.5f}, "
        f"std {ref_t.std_ms:.5f}\ncandidate: mean {new_t.mean_ms:.5f} ms, median {new_t.median_ms:.5f}, "
        f"std {new_t.std_ms:.5f}\ndevice: {ctx.device_name}\n{compile_log}"
    ).strip()
    return Verdict(
        "correct",
        True,
        True,
        speedup=speedup,
        ref_ms=ref_t.mean_ms,
        new_ms=new_t.mean_ms,
        max_abs_err=run.max_abs_err,
        message=message,
        log=log,
        flags=flags,
    )


def _first_error(log: str, fallback: str) -> str:
    for line in log.splitlines():
        if "error" in line:
            return line.strip()
    return fallback
