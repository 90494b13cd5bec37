"""The ``.cu`` path, run inside a worker: the compile checks (:mod:`dice.validator.cu_compile`: NVRTC on the
device code, nvcc on the whole file with the project's flags), and with a ``dice-spec`` plus a GPU: inputs,
launch, reference, comparison and timing. The spec run is the user's: for a fill, the task's
``spec_origin`` (parsed before the splice, :mod:`dice.validator.spec_origin`), never one read from the
spliced text, which is rejected when it shows another. Correctness needs two independently seeded input sets
(:data:`SPEC_SEEDS`: ``inputs()`` after seeding torch, ``random`` and NumPy with 0, then with 1), each
compared by :func:`dice.validator.gpu.compare_outputs`; timing uses the first."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dice.validator.build_flags import BuildOptions
from dice.validator.compile import nvrtc_std_options
from dice.validator.cu_compile import CuFile, run_compile_checks
from dice.validator.paths import cuda_include_dirs
from dice.validator.runtime_guards import Replaced, all_equal, monkey_patch
from dice.validator.spec_files import spec_folder_imports
from dice.validator.spec_origin import SpecOrigin, fill_changes_spec, spec_change
from dice.validator.unchecked import describe_unchecked
from dice.validator.verdict import FLAG_NOT_RUN, FLAG_NOT_TRUSTED, Verdict, speedup_flags

if TYPE_CHECKING:
    from dice.cuda_source import CudaDocument
    from dice.validator.context import WorkerContext
    from dice.validator.gpu import Timing

DEFAULT_ATOL = 1e-2
DEFAULT_RTOL = 1e-2
CU_WARMUP = 3
CU_TRIALS = 30  # the editor waits on these; KernelBench uses 100
# Correctness needs every one of these input sets (inputs() right after seeding with each): a kernel that is
# right on one input by accident (a hard-coded answer, a result cached across calls) does not pass.
SPEC_SEEDS = (0, 1)


def run_cu(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    from dice.cuda_source import extract_device_code, parse_document

    build = task.get("build")
    file = CuFile(
        text=task["text"],
        filename=task.get("filename") or "kernel.cu",
        folder=task.get("folder") or None,
        build=BuildOptions.from_json(build) if build else None,
    )
    not_run: str | None = task.get("not_run") or None  # an untrusted workspace: its spec is never run
    run: bool = bool(task.get("run", True)) and not_run is None
    ctx.phase("build")
    doc = parse_document(file.text)
    spec_source = spec_to_run(task, doc)
    if isinstance(spec_source, Verdict):
        return spec_source, False
    device = extract_device_code(file.text)
    kernels = [f.name for f in doc.functions if f.kind == "global" and f.name]
    checks = run_compile_checks(ctx, file, device, doc)
    ctx.task_deps = list(checks.deps)
    if checks.error is not None:
        return checks.error, False

    def compiled_only(reason: str, flags: tuple[str, ...] = ()) -> tuple[Verdict, bool]:
        message = "compiled: " + "; ".join(checks.checked) + f". Not run: {reason}."
        if checks.unchecked:
            described = describe_unchecked(checks.unchecked)
            message += f" {described[:1].upper()}{described[1:]}."
        if checks.notes:
            message += " " + " ".join(n.rstrip(".") + "." for n in checks.notes)
        return Verdict(
            "compiled",
            True,
            None,
            message=message,
            log=checks.log,
            flags=[FLAG_NOT_RUN, *flags],
            diagnostics=checks.warnings,
            unchecked=checks.unchecked,
        ), False

    if spec_source is None:
        return compiled_only(
            "the file has no dice-spec block (add one with inputs/reference/launch to run it)"
        )
    if not_run is not None:
        return compiled_only(not_run, (FLAG_NOT_TRUSTED,))
    if not run:
        return compiled_only("compile-only validation was requested")
    if not ctx.gpu:
        return compiled_only("no CUDA GPU on this machine")
    if checks.nvrtc is None or not checks.nvrtc.ok:
        return compiled_only("running needs the device code compiled alone by NVRTC, which failed")

    ctx.acquire_gpu()
    return _run_spec(
        ctx,
        device.source,
        kernels,
        spec_source,
        file.filename,
        checks.checked,
        checks.log,
        file.folder,
        checks.nvrtc_options,
    )


def spec_to_run(task: dict[str, Any], doc: CudaDocument) -> str | None | Verdict:
    """The spec source the task runs (None: no spec), or the verdict refusing it. A task with fills spliced
    in carries ``spec_origin``, the user's spec parsed before the splice: that is the spec, and a spliced
    text showing another is rejected (:func:`dice.validator.spec_origin.spec_change`). Without it the
    text is the user's own file and its spec is theirs."""
    if not task.get("spec_origin"):
        return None if doc.spec is None else doc.spec.source
    origin = SpecOrigin.from_json(task["spec_origin"])
    changed = spec_change(origin, doc)
    if changed is not None:
        return fill_changes_spec(changed)
    return origin.source


@dataclass
class _SpecRun:
    """A dice-spec that ran correctly and was timed."""

    atol: float
    rtol: float
    max_abs_err: float | None
    ref_t: Timing
    new_t: Timing
    checked_inputs: str = ""  # the log line saying which input sets were compared


def seed_everything(seed: int) -> None:
    """Seed every generator a spec's ``inputs()`` may draw from: torch (CPU and every CUDA device), Python's
    ``random`` and NumPy's global generator."""
    import random

    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # pragma: no cover - NumPy comes with CuPy and torch
        return
    numpy.random.seed(seed)


def spec_input_sets(inputs: Callable[[], Any], seed: int) -> tuple[list[Any], list[Any]]:
    """Two calls of the spec's ``inputs()``, each right after :func:`seed_everything` with ``seed``: one set
    for ``reference``, an equal but separate one for ``launch`` (neither sees what the other wrote)."""
    seed_everything(seed)
    ref_inputs = list(inputs())
    seed_everything(seed)
    new_inputs = list(inputs())
    return ref_inputs, new_inputs


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
    nvrtc_options: list[str] | None = None,
) -> tuple[Verdict, bool]:
    # imported outside the try, as before: a broken CuPy or torch is the validator's error, not the spec's
    import cupy  # noqa: F401
    import torch  # noqa: F401

    import dice.validator.gpu  # noqa: F401

    stage = _Stage("compiling the module with CuPy")
    try:
        with spec_folder_imports(folder):
            outcome = _check_spec(
                source, kernels, spec_source, filename, compile_log, stage, nvrtc_options or []
            )
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
    source: str,
    kernels: list[str],
    spec_source: str,
    filename: str,
    compile_log: str,
    stage: _Stage,
    nvrtc_options: list[str],
) -> _SpecRun | Verdict:
    """Compile the module, execute the dice-spec, compare ``launch`` with ``reference`` and time both; the
    verdict when the spec is incomplete or the output wrong. ``stage`` follows the steps."""
    import cupy

    from dice.validator.gpu import L2Flusher, TorchModule, time_cuda

    std = nvrtc_std_options([o for o in nvrtc_options if o.startswith("-std=")])
    options = (
        *std,
        *(o for o in nvrtc_options if not o.startswith("-std=")),
        *(f"-I{d}" for d in cuda_include_dirs()),
    )
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
    checked = _spec_correctness(namespace, module, atol, rtol, stage, compile_log)
    if isinstance(checked, Verdict):
        return checked
    ref_inputs, new_inputs, worst, checked_inputs = checked
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
    return _SpecRun(atol, rtol, worst, ref_t, new_t, checked_inputs)


def _spec_correctness(
    namespace: dict[str, Any], module: Any, atol: float, rtol: float, stage: _Stage, compile_log: str
) -> tuple[list[Any], list[Any], float | None, str] | Verdict:
    """Compare ``launch`` with ``reference`` on every input set of :data:`SPEC_SEEDS`: ``(the first set's
    reference inputs, its launch inputs, the worst max abs error, the log line)``, or the verdict of the
    first set that fails."""
    import torch

    from dice.validator.gpu import compare_outputs

    first: tuple[list[Any], list[Any]] | None = None
    worst: float | None = None
    same_values = False
    for number, seed in enumerate(SPEC_SEEDS, 1):
        stage.name = f"building inputs (seed {seed})"
        ref_inputs, new_inputs = spec_input_sets(namespace["inputs"], seed)
        if first is None:
            first = (ref_inputs, new_inputs)
        else:
            same_values = same_values or all_equal(ref_inputs, first[0])
        stage.name = f"running reference() (seed {seed})"
        ref_out = namespace["reference"](*ref_inputs)
        stage.name = f"running launch() (seed {seed})"
        new_out = namespace["launch"](module, *new_inputs)
        torch.cuda.synchronize()
        if new_out is None:
            return Verdict(
                "runtime_error",
                True,
                message="launch(module, *inputs) returned None: return the "
                "output tensor(s) so they can be compared with reference()",
            )
        stage.name = f"comparing (seed {seed})"
        cmp = compare_outputs(new_out, ref_out, atol=atol, rtol=rtol)
        if not cmp.correct:
            return Verdict(
                "incorrect",
                True,
                False,
                max_abs_err=cmp.max_abs_err,
                message=f"incorrect (input set {number} of {len(SPEC_SEEDS)}, seed {seed}): {cmp.message}",
                log=compile_log,
            )
        if cmp.max_abs_err is not None:
            worst = max(worst or 0.0, cmp.max_abs_err)
        del ref_out, new_out
        if number > 1:
            del ref_inputs, new_inputs
    assert first is not None
    line = (
        f"correctness: {len(SPEC_SEEDS)} input sets (inputs() after seeds "
        f"{', '.join(map(str, SPEC_SEEDS))}) matched at atol={atol:g} rtol={rtol:g}"
    )
    if worst is not None:
        line += f", max abs err {worst:.3g}"
    if same_values:
        line += "; inputs() gave the same values for every seed (it draws no seeded random numbers)"
    return first[0], first[1], worst, line


def _correct_verdict(ctx: WorkerContext, run: _SpecRun, checked: list[str], compile_log: str) -> Verdict:
    ref_t, new_t = run.ref_t, run.new_t
    speedup = ref_t.mean_ms / new_t.mean_ms if new_t.mean_ms > 0 else None
    flags: list[str] = []
    message = (
        f"correct ({len(SPEC_SEEDS)} input sets, atol={run.atol:g}, rtol={run.rtol:g}); "
        f"{speedup:.2f}x vs reference "
        f"({ref_t.mean_ms:.4f} ms -> {new_t.mean_ms:.4f} ms, mean of {CU_TRIALS} after {CU_WARMUP} warm-up)"
    )
    extra_flags, note = speedup_flags(speedup)
    flags += extra_flags
    message += note
    log = (
        f"checked: {'; '.join(checked)}\n{run.checked_inputs}\n"
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
