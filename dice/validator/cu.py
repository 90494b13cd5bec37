"""The ``.cu`` path, run inside a worker: the compile checks (:mod:`dice.validator.cu_compile`: NVRTC on the
device code, nvcc on the whole file with the project's flags), and with a ``dice-spec`` plus a GPU the judged
run. The spec run is the user's: for a fill, the task's ``spec_origin`` (parsed before the splice,
:mod:`dice.validator.spec_origin`), never one read from the spliced text, which is rejected when it shows
another.

The fill's device code never runs in this process: its module is compiled and launched in a runner forked
for it (:mod:`dice.validator.cu_runner`), which executes the spec for ``launch`` only. This process (the
judge, :mod:`dice.validator.judge`) executes the spec for ``inputs()`` and ``reference()``, keeps the
reference's outputs in its own CUDA context, compares and times; the kernel sees its inputs and writes its
outputs only through the judge's shared buffers. Correctness needs two independently seeded input sets
(:data:`SPEC_SEEDS`: ``inputs()`` after seeding torch, ``random`` and NumPy with 0, then with 1), each
compared by :func:`dice.validator.gpu.compare_outputs`. Timing draws a fresh set every round
(``inputs()`` after a seed drawn at random, :class:`dice.validator.judge.Draws`) and checks every round's
outputs, so a kernel that remembers answers by their inputs gains nothing and one right only for the fixed
seeds is caught."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dice.validator.build_flags import BuildOptions
from dice.validator.compile import nvrtc_std_options
from dice.validator.cu_compile import CuFile, run_compile_checks
from dice.validator.judge import ProtocolViolation, RunnerFailed
from dice.validator.paths import cuda_include_dirs
from dice.validator.runtime_guards import Replaced, all_equal, monkey_patch
from dice.validator.spec_files import spec_folder_imports
from dice.validator.spec_origin import SpecOrigin, fill_changes_spec, spec_change
from dice.validator.unchecked import describe_unchecked
from dice.validator.verdict import FLAG_NOT_RUN, FLAG_NOT_TRUSTED, Verdict, speedup_flags

if TYPE_CHECKING:
    from dice.cuda_source import CudaDocument
    from dice.validator.context import WorkerContext

DEFAULT_ATOL = 1e-2
DEFAULT_RTOL = 1e-2
CU_WARMUP = 3
CU_TRIALS = 30  # the editor waits on these; KernelBench uses 100
# Correctness needs every one of these input sets (inputs() right after seeding with each): a kernel that is
# right on one input by accident (a hard-coded answer, a result cached across calls) does not pass.
SPEC_SEEDS = (0, 1)
# What the runner's start does (:mod:`dice.validator.cu_runner`), as its failures name it.
RUNNER_STAGES = ("compiling the module with CuPy", "executing the dice-spec block")


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
    if not (ctx.gpu or ctx.emulated):
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
    """A dice-spec that ran correctly and was timed (:func:`dice.validator.judge.time_rounds`' summaries)."""

    atol: float
    rtol: float
    max_abs_err: float | None
    ref_t: dict[str, float]
    new_t: dict[str, float]
    checked_inputs: str = ""  # the log line saying which input sets were compared
    timed_inputs: str = ""  # how the timing rounds' inputs were drawn
    runner: str = ""  # the runner's start


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


def spec_inputs(inputs: Callable[[], Any], seed: int) -> list[Any]:
    """The spec's ``inputs()`` right after :func:`seed_everything` with ``seed``. The judge keeps them for
    ``reference``; ``launch`` gets a copy in the runner's shared buffers (neither sees the other's writes)."""
    seed_everything(seed)
    return list(inputs())


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
    """The spec run with the fill's module in a runner of its own (:mod:`dice.validator.cu_runner`): this
    process executes the spec for ``inputs()`` and ``reference()``, keeps the reference's outputs, compares
    and times; (verdict, restart this worker). The fill's crash, hang or CUDA fault costs its runner."""
    import torch

    stage = _Stage("executing the dice-spec block")
    device = torch.device("cuda", torch.cuda.current_device()) if ctx.gpu else torch.device("cpu")
    session = None
    try:
        with spec_folder_imports(folder):
            namespace: dict[str, Any] = {"__name__": "dice_spec"}
            exec(compile(spec_source, f"{filename} (dice-spec)", "exec"), namespace)  # noqa: S102 - user's spec
            missing = [n for n in ("inputs", "reference", "launch") if not callable(namespace.get(n))]
            if missing:
                return Verdict(
                    "runtime_error",
                    True,
                    message="dice-spec must define inputs(), reference(*inputs) and "
                    f"launch(module, *inputs); missing: {', '.join(missing)}",
                ), False
            stage.name = "starting the kernel's process"
            session = _start_runner(
                ctx, device, source, kernels, spec_source, filename, folder, nvrtc_options
            )
            outcome = _check_spec(session, namespace, stage, compile_log)
    except (RunnerFailed, ProtocolViolation) as exc:  # the kernel's process failed or broke the protocol
        return _runner_failure(exc, stage, compile_log), False
    except Exception as exc:  # noqa: BLE001 - the spec failed here (its inputs() or reference())
        # a CUDA fault in this process poisons its context: the worker is replaced
        return Verdict(
            "runtime_error",
            True,
            message=f"runtime error while {stage.name}: {type(exc).__name__}: {exc}",
            log=traceback.format_exc(),
        ), True
    finally:
        if session is not None:
            session.close()
        if device.type == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    if isinstance(outcome, Verdict):
        return outcome, False
    patched = monkey_patch(Replaced("the run", ctx.integrity.violations()))
    if patched is not None:
        return Verdict("rejected", True, message="monkey_patch: " + patched), True
    return _correct_verdict(ctx, outcome, checked, compile_log), False


def _runner_failure(cause: RunnerFailed | ProtocolViolation, stage: _Stage, compile_log: str) -> Verdict:
    from dice.validator.judge import runner_verdict

    if isinstance(cause, ProtocolViolation):
        return runner_verdict(cause, compile_log)
    message = getattr(cause, "message", str(cause))
    log = (compile_log + "\n" + getattr(cause, "log", "")).strip()
    for where in RUNNER_STAGES:  # the runner's start names its own stage
        if stage.name == "starting the kernel's process" and message.startswith(where + ": "):
            return Verdict("runtime_error", True, message=f"runtime error while {message}", log=log)
    return Verdict("runtime_error", True, message=f"runtime error while {stage.name}: {message}", log=log)


def _start_runner(
    ctx: WorkerContext,
    device: Any,
    source: str,
    kernels: list[str],
    spec_source: str,
    filename: str,
    folder: str | None,
    nvrtc_options: list[str] | None,
) -> Any:
    """The fill's runner, ready (module compiled, spec executed there): its :class:`Session`."""
    import os

    from dice.validator.judge import RunnerProcess, Session, runner_args

    options = list(nvrtc_options or [])
    std = nvrtc_std_options([o for o in options if o.startswith("-std=")])
    options = [
        *std,
        *(o for o in options if not o.startswith("-std=")),
        *(f"-I{d}" for d in cuda_include_dirs()),
    ]
    cupy_cache = ctx.cache_dir / "cupy"
    cupy_cache.mkdir(parents=True, exist_ok=True)
    args = {
        **runner_args(ctx, ctx.task_dir()),
        "writable": [str(cupy_cache)],
        "cupy_cache": str(cupy_cache),
        "device": str(device),
        "source": source,
        "kernels": kernels,
        "options": options,
        "spec_source": spec_source,
        "filename": filename,
        "folder": folder,
        "emulated": os.environ.get("DICE_EMULATED_EXTENSIONS") if ctx.emulated else None,
    }
    started = time.perf_counter()
    session = Session(RunnerProcess(ctx.zygote, "cu", args), device)
    try:
        ready = session.runner.receive(0, "ready")
    except (RunnerFailed, ProtocolViolation):
        session.close()
        raise
    phases = ready.get("phases") if isinstance(ready.get("phases"), dict) else {}
    steps = ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if isinstance(v, (int, float)))
    session.started = f"kernel's process ready {time.perf_counter() - started:.2f} s ({steps or 'no phases'})"
    return session


def _check_spec(
    session: Any, namespace: dict[str, Any], stage: _Stage, compile_log: str
) -> _SpecRun | Verdict:
    """Compare ``launch`` (in the runner) with ``reference`` (here) and time both; the verdict when the output
    is wrong. ``stage`` follows the steps."""
    from dice.validator.gpu import l2_flusher
    from dice.validator.judge import Draws, Mismatch, time_rounds

    atol = float(namespace.get("atol", DEFAULT_ATOL))
    rtol = float(namespace.get("rtol", DEFAULT_RTOL))
    checked = _spec_correctness(session, namespace, atol, rtol, stage, compile_log)
    if isinstance(checked, Verdict):
        return checked
    worst, checked_inputs = checked
    stage.name = "drawing the timing rounds' inputs"
    draws = Draws(lambda seed: spec_inputs(namespace["inputs"], seed), CU_WARMUP + CU_TRIALS)
    stage.name = "timing"
    timed = time_rounds(
        session,
        namespace["reference"],
        draws,
        l2_flusher(session.device),
        (atol, rtol),
        warmup=CU_WARMUP,
        trials=CU_TRIALS,
    )
    draws.close()
    if isinstance(timed, Mismatch):
        return Verdict(
            "incorrect",
            True,
            False,
            message=f"incorrect (timing round {timed.round} of {CU_WARMUP + CU_TRIALS}, inputs() after seed "
            f"{timed.seed}): {timed.message}",
            log=compile_log,
        )
    ref_t, new_t = timed
    return _SpecRun(atol, rtol, worst, ref_t, new_t, checked_inputs, draws.describe, session.started)


def _spec_correctness(
    session: Any, namespace: dict[str, Any], atol: float, rtol: float, stage: _Stage, compile_log: str
) -> tuple[float | None, str] | Verdict:
    """Compare ``launch`` with ``reference`` on every input set of :data:`SPEC_SEEDS`: ``(the worst max abs
    error, the log line)``, or the verdict of the first set that fails."""
    from dice.validator.gpu import compare_outputs
    from dice.validator.judge import poison, rebuild, sync

    first: list[Any] | None = None
    worst: float | None = None
    same_values = False
    for number, seed in enumerate(SPEC_SEEDS, 1):
        stage.name = f"building inputs (seed {seed})"
        inputs = spec_inputs(namespace["inputs"], seed)
        if first is None:
            first = inputs
        else:
            same_values = same_values or all_equal(inputs, first)
        session.put_inputs(inputs)  # before the reference, which may change its inputs in place
        stage.name = f"running reference() (seed {seed})"
        ref_out = namespace["reference"](*inputs)
        slots = session.slots_like(ref_out)
        poison(slots)
        sync(session.device)
        stage.name = f"running launch() (seed {seed})"
        reply = session.runner.request("trial", "trial")
        if reply.get("none"):
            return Verdict(
                "runtime_error",
                True,
                message="launch(module, *inputs) returned None: return the "
                "output tensor(s) so they can be compared with reference()",
            )
        stage.name = f"comparing (seed {seed})"
        where = f"input set {number} of {len(SPEC_SEEDS)}, seed {seed}"
        if reply.get("mismatch"):
            return Verdict(
                "incorrect", True, False, message=f"incorrect ({where}): {reply['mismatch']}"[:600]
            )
        new_out = rebuild(ref_out, slots, list(reply.get("values") or []))
        cmp = compare_outputs(new_out, ref_out, atol=atol, rtol=rtol)
        if not cmp.correct:
            return Verdict(
                "incorrect",
                True,
                False,
                max_abs_err=cmp.max_abs_err,
                message=f"incorrect ({where}): {cmp.message}",
                log=compile_log,
            )
        if cmp.max_abs_err is not None:
            worst = max(worst or 0.0, cmp.max_abs_err)
        del ref_out, new_out, inputs
    line = (
        f"correctness: {len(SPEC_SEEDS)} input sets (inputs() after seeds "
        f"{', '.join(map(str, SPEC_SEEDS))}) matched at atol={atol:g} rtol={rtol:g}"
    )
    if worst is not None:
        line += f", max abs err {worst:.3g}"
    if same_values:
        line += "; inputs() gave the same values for every seed (it draws no seeded random numbers)"
    return worst, line


def _correct_verdict(ctx: WorkerContext, run: _SpecRun, checked: list[str], compile_log: str) -> Verdict:
    ref_t, new_t = run.ref_t, run.new_t
    speedup = ref_t["mean_ms"] / new_t["mean_ms"] if new_t["mean_ms"] > 0 else None
    flags: list[str] = []
    message = (
        f"correct ({len(SPEC_SEEDS)} input sets, atol={run.atol:g}, rtol={run.rtol:g}); "
        f"{speedup:.2f}x vs reference "
        f"({ref_t['mean_ms']:.4f} ms -> {new_t['mean_ms']:.4f} ms, mean of {CU_TRIALS} after {CU_WARMUP} "
        "warm-up, every round's outputs checked)"
    )
    extra_flags, note = speedup_flags(speedup)
    flags += extra_flags
    message += note
    log = (
        f"checked: {'; '.join(checked)}\n{run.checked_inputs}\n{run.runner}\n"
        f"timing: {run.timed_inputs}; L2 flushed before every call\n"
        f"reference (here, host clock): mean {ref_t['mean_ms']:.5f} ms, median {ref_t['median_ms']:.5f}, "
        f"std {ref_t['std_ms']:.5f} (an empty synchronisation, {ref_t['baseline_ms']:.5f} ms, subtracted)\n"
        f"candidate (in its process, timed from here, go/done): mean {new_t['mean_ms']:.5f} ms, median "
        f"{new_t['median_ms']:.5f}, std {new_t['std_ms']:.5f} (an empty round trip, "
        f"{new_t['baseline_ms']:.5f} ms, subtracted)\ndevice: {ctx.device_name}\n{compile_log}"
    ).strip()
    return Verdict(
        "correct",
        True,
        True,
        speedup=speedup,
        ref_ms=ref_t["mean_ms"],
        new_ms=new_t["mean_ms"],
        max_abs_err=run.max_abs_err,
        message=message,
        log=log,
        flags=flags,
    )
