"""The KernelBench path, run inside a worker: the judge's side of it (the candidate runs in a runner).

Protocol (KernelBench's, made stricter): ``Model`` and ``ModelNew`` are built as KernelBench builds them, on
the CPU, each after ``torch.manual_seed(42)``, from the same init inputs, then moved to the GPU
(:mod:`dice.validator.kbsetup`) -- ``Model`` here, ``ModelNew`` in the candidate's own runner process
(:mod:`dice.validator.judge`, :mod:`dice.validator.runner`): this process never imports a candidate. Then 5
correctness trials with inputs drawn from seeds picked at random for this run (written into the same
shared buffers, so a cache keyed on pointers is caught); shape/dtype check, ``allclose`` at 1e-2
(``strict``: 1e-4) and the degenerate-output check of :func:`dice.validator.gpu.compare_outputs` (a
constant, all-zero or far too small output fails even inside the tolerance), all on the judge's memory;
one profiled forward in the runner (``kernel_never_called``); then timing from outside (3 warm-up rounds,
100 trials, L2 flushed before each, 3 input sets, the outputs checked after every round), the eager
reference timed live in the same run. Inputs are drawn on the CPU under the trial's seed and moved, as
KernelBench does, except large ones (over ``kbsetup.CPU_INPUT_ELEMENTS`` elements: CPU generation of
KernelBench's multi-GB inputs takes seconds per trial), which are drawn on the GPU under the same seed; the
log says which. Dtypes are kept, so integer inputs stay integers.

The pieces live beside this module: builds and the extension cache in :mod:`dice.validator.builds`, the check
without a GPU in :mod:`dice.validator.kbstatic`, the static guards in :mod:`dice.validator.guards` and the
dynamic ones (checked here and in the runner, in the order of their table) in
:mod:`dice.validator.runtime_guards`. ``DICE_VALIDATOR_EMULATE=cpu`` (the CPU tests) runs this whole path
on the CPU, ``load_inline`` in the runner served by the stand-ins of ``DICE_EMULATED_EXTENSIONS``.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dice.validator.builds import describe_builds, import_source
from dice.validator.gpu import compare_outputs, l2_flusher
from dice.validator.guards import analyze_candidate, static_guards
from dice.validator.judge import (
    MAX_KEPT_SETS,
    Draws,
    Mismatch,
    Session,
    meta,
    poison,
    random_seeds,
    rebuild,
    runner_rejection,
    sync,
    task_args,
    time_rounds,
)
from dice.validator.kbsetup import SEED, construct_model, draw_init_inputs, generate_inputs
from dice.validator.kbstatic import static_compile_check
from dice.validator.paths import source_hash
from dice.validator.reference import check_reference
from dice.validator.runtime_guards import (
    Launch,
    Replaced,
    Trial,
    clone,
    first_rejection,
    rejected,
    same_storage,
    tensors,
)
from dice.validator.verdict import (
    FLAG_CUSTOM_KERNELS_MINOR,
    FLAG_LAUNCH_NOT_VERIFIED,
    FLAG_TIMING_STOPPED,
    GPU_LOCK_LINE,
    Verdict,
    speedup_flags,
)

if TYPE_CHECKING:
    from dice.validator.context import WorkerContext

CORRECTNESS_TRIALS = 5
WARMUP = 3
TIMING_TRIALS = 100
ATOL = RTOL = 1e-2
STRICT_ATOL = STRICT_RTOL = 1e-4


def run_kernelbench(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    ref_src: str = task["ref_src"]
    cand_src: str = task["cand_src"]
    strict = bool(task.get("strict", False))
    timing = bool(task.get("timing", True))
    stop_below = task.get("stop_below")
    stop_below = float(stop_below) if isinstance(stop_below, (int, float)) and stop_below > 0 else None
    ctx.phase("build")
    check_reference(ref_src)
    try:
        info = analyze_candidate(cand_src)
    except SyntaxError as exc:
        return Verdict(
            "compile_error",
            False,
            message=f"candidate has a Python syntax error at line {exc.lineno}: {exc.msg}",
            diagnostics=[{"line": (exc.lineno or 1) - 1, "severity": "error", "message": exc.msg}],
        ), False
    if not info.has_model_new:
        return Verdict("compile_error", False, message="candidate defines no class ModelNew"), False
    hits = static_guards(cand_src, info)
    if hits:
        v = rejected(hits[0].guard, hits[0].message, where=hits[0].where, compiled=False)
        v.log = "\n".join(h.describe() for h in hits)
        return v, False
    not_run = task.get("not_run") or None  # an untrusted workspace: neither reference nor candidate runs
    if not (ctx.gpu or ctx.emulated) or not_run is not None:
        return static_compile_check(info, strict, not_run=not_run), False
    return _run_judged(ctx, ref_src, cand_src, strict, timing, stop_below)


# ------------------------------------------------------------------------------------------------- GPU run
def _run_judged(
    ctx: WorkerContext,
    ref_src: str,
    cand_src: str,
    strict: bool,
    timing: bool,
    stop_below: float | None = None,
) -> tuple[Verdict, bool]:
    """The run with the candidate in a runner of its own (:mod:`dice.validator.judge`): (verdict, restart
    this worker). A candidate's crash, hang or CUDA fault costs its runner, not this process."""
    import torch

    from dice.validator.judge import (
        ProtocolViolation,
        RunnerFailed,
        RunnerProcess,
        Session,
        build_for_runner,
        runner_verdict,
    )
    from dice.validator.zygote_client import ZygoteError

    device = torch.device("cuda", torch.cuda.current_device()) if ctx.gpu else torch.device("cpu")
    task_dir = ctx.task_dir()
    key = source_hash(cand_src, length=12)
    start = time.perf_counter()
    try:
        ref = import_source(ref_src, task_dir / "reference.py", f"dice_ref_{key}")
        init = draw_init_inputs(ref, SEED)
        model, construction = construct_model(ref.Model, init, device, SEED)
    except Exception as exc:  # noqa: BLE001
        return Verdict(
            "runtime_error",
            False,
            message=f"the reference failed to import: {exc}",
            log=traceback.format_exc(),
        ), False
    finally:
        sys.modules.pop(f"dice_ref_{key}", None)
    construction = construction.replace("model built", "Model and ModelNew built")
    try:
        args = task_args(ctx, cand_src, task_dir, init, device)
        builder = functools.partial(build_for_runner, ctx)
        session = Session(RunnerProcess(ctx.zygote, "kernelbench", args, builder=builder), device)
    except (ZygoteError, OSError) as exc:
        return Verdict("runtime_error", False, message=f"validator error: {exc}"), True
    build_log = construction
    try:
        try:
            ready = session.runner.receive(0, "ready")
        except RunnerFailed as exc:
            exc.log = f"{describe_builds(exc.records)}\n{exc.log}"
            raise
        build_log = _ready_log(ready, time.perf_counter() - start, construction)
        verdict = first_rejection(
            Replaced("importing the candidate", [str(n) for n in ready.get("replaced") or []])
        )
        if verdict is not None:
            return verdict, False
        verdict = _judged_on_gpu(ctx, session, model, ref, device, (strict, timing, stop_below), ready)
        verdict.log = f"{build_log}\n{verdict.log}".strip()
        return verdict, False
    except (RunnerFailed, ProtocolViolation) as exc:
        return runner_verdict(exc, build_log), False
    except Exception as exc:  # noqa: BLE001 - a failure on the judge's side: this worker starts afresh
        return Verdict(
            "runtime_error", True, message=f"runtime error: {_short(exc)}", log=traceback.format_exc()
        ), True
    finally:
        session.close()
        del model
        if device.type == "cuda":
            # tensors held by reference cycles (a traceback's frames) first, else their blocks stay cached
            # in this idle worker: idle workers holding 6-30 GiB each ran the working one out of memory
            gc.collect()
            torch.cuda.empty_cache()


def _ready_log(ready: dict[str, Any], seconds: float, construction: str) -> str:
    """The build line of a verdict log: the runner's builds, when it was ready and its own phases."""
    records = [r for r in ready.get("records") or [] if isinstance(r, dict)]
    phases = ready.get("phases") if isinstance(ready.get("phases"), dict) else {}
    steps = ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if isinstance(v, (int, float)))
    return (
        f"{describe_builds(records)}; runner ready {seconds:.2f} s "
        f"(after the fork: {steps or 'not reported'})\n{construction}"
    )


def _judged_on_gpu(
    ctx: WorkerContext,
    session: Session,
    model: Any,
    ref: ModuleType,
    device: Any,
    options: tuple[bool, bool, float | None],
    ready: dict[str, Any],
) -> Verdict:
    """Under the GPU's lock: the checks and the timing (``options``: strict, timing, stop_below), then the
    runner's last look at what the candidate replaced; the log opens with the lock's wait and hold times."""
    import torch

    strict, timing, stop_below = options
    waited = time.perf_counter()
    ctx.acquire_gpu()
    held = time.perf_counter()
    with torch.no_grad():
        names = [str(n) for n in ready.get("kernel_names") or []]
        verdict = _check_and_time(
            session, model, ref, device, strict, timing, names, ctx.device_name, stop_below
        )
    replaced = session.runner.request("check", "check").get("replaced") or []
    patched = first_rejection(Replaced("the candidate", [str(n) for n in replaced]))
    verdict = patched if patched is not None else verdict
    # the GPU is the pool's one serial resource: BatchStats sums this line (gpu_held_s, gpu_wait_s)
    gpu_line = f"{GPU_LOCK_LINE} waited {held - waited:.2f} s, held {time.perf_counter() - held:.2f} s"
    verdict.log = f"{gpu_line}\n{verdict.log}".strip()
    return verdict


def _short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def _check_and_time(
    session: Session,
    model: Any,
    ref: ModuleType,
    device: Any,
    strict: bool,
    timing: bool,
    kernel_names: list[str],
    device_name: str | None,
    stop_below: float | None = None,
) -> Verdict:
    """Correctness trials, the kernel-launch check, then timing (ended after its pilot rounds for a speedup
    below ``stop_below``, when given); the first guard that fires decides."""
    atol, rtol = (STRICT_ATOL, STRICT_RTOL) if strict else (ATOL, RTOL)
    failed, last_inputs, worst, drawn = _correctness_trials(session, model, ref, device, atol, rtol)
    if failed is not None:
        failed.log = f"{drawn}\n{failed.log}".strip()
        return failed
    flags: list[str] = []
    log: list[str] = [
        drawn,
        f"correctness: {CORRECTNESS_TRIALS} trials passed at atol={atol:g} rtol={rtol:g}, "
        f"max abs err {worst:.3g}",
    ]
    never_called = _launch_check(session, kernel_names, flags, log)
    if never_called is not None:
        return never_called
    input_bytes = sum(x.numel() * x.element_size() for x in tensors(last_inputs))
    del last_inputs  # one set at a time (multi-GB problems): timing draws its own
    if not timing:
        verdict = Verdict(
            "correct",
            True,
            True,
            max_abs_err=worst,
            message=f"correct ({CORRECTNESS_TRIALS} trials, atol={atol:g}); timing skipped",
            log="\n".join(log),
            flags=flags,
        )
    else:
        verdict = _timed_verdict(
            session, model, ref, device, input_bytes, (atol, rtol), worst, flags, log, device_name, stop_below
        )
    if verdict.status != "correct":
        return verdict
    # last: a forward on shifted results may fault the device (an index computed from them)
    unused, line = _dependence_check(session, model, ref, device, (atol, rtol))
    if unused is not None:
        unused.log = f"{verdict.log}\n{line}"
        return unused
    verdict.log = f"{verdict.log}\n{line}"
    return verdict


def _dependence_check(
    session: Session, model: Any, ref: ModuleType, device: Any, tolerance: tuple[float, float]
) -> tuple[Verdict | None, str]:
    """One forward on a fresh input set with the candidate's extension results shifted by noise
    (:mod:`dice.validator.dependence`): the rejection when its output still matches the reference, and
    the log line."""
    from dice.validator.dependence import same_output

    seeds = random_seeds(2)
    other = clone(model(*generate_inputs(ref, device, seeds[0], cpu_limit=0)[0]))
    inputs = generate_inputs(ref, device, seeds[1], cpu_limit=0)[0]
    session.put_inputs(inputs)  # before the reference, which may change its inputs in place
    want = model(*inputs)
    del inputs
    if same_output(want, other):
        return None, (
            "extension results: not checked for use (the reference gives the same output for two input sets)"
        )
    del other
    slots = session.slots_like(want)
    poison(slots)
    sync(device)
    reply = session.runner.request("dependence", "dependence", seed=random_seeds(1)[0])
    perturbed = int(reply.get("perturbed") or 0)
    shifted = f"{perturbed} result(s) of its extension functions shifted by noise"
    if reply.get("raised"):
        return None, f"extension results: used (forward fails with the {shifted})"
    if perturbed == 0:
        return None, (
            "extension results: not checked for use (no extension call returned or wrote a floating tensor)"
        )
    if reply.get("mismatch"):
        return None, f"extension results: used (forward's output changes with the {shifted})"
    got = rebuild(want, slots, list(reply.get("values") or []))
    cmp = compare_outputs(got, want, atol=tolerance[0], rtol=tolerance[1])
    if cmp.correct:
        return rejected(
            "kernel_result_unused",
            f"forward's output still matches the reference with the {shifted}: the kernels' work is not "
            "what it returns",
        ), f"extension results: not used (forward's output unchanged with the {shifted})"
    return None, f"extension results: used (forward's output changes with the {shifted})"


def _correctness_trials(
    session: Session, model: Any, ref: ModuleType, device: Any, atol: float, rtol: float
) -> tuple[Verdict | None, list[Any], float, str]:
    """(the verdict of the first trial that fails or None, the last trial's inputs as drawn, worst abs
    error, the log line saying how the inputs were drawn)."""
    seeds = random_seeds(CORRECTNESS_TRIALS)
    previous: tuple[Any, Any] | None = None
    worst = 0.0
    drawn: list[str] = []
    saved: list[Any] = []
    for number, seed in enumerate(seeds, 1):
        # The last trial's tensors go before the next are drawn: on a multi-GB problem (19: 6 GiB a tensor)
        # two trials' worth at once ran the judge out of memory on the H200.
        saved = []
        inputs, where_drawn = generate_inputs(ref, device, seed)
        if where_drawn not in drawn:
            drawn.append(where_drawn)
        line = "inputs: " + "; ".join(drawn) + f"; seeds drawn for this run: {', '.join(map(str, seeds))}"
        saved = [clone(x) for x in inputs]
        views = session.put_inputs(inputs)  # before the reference, which may change its inputs in place
        trial = _observe_trial(session, model, inputs, views, saved, previous, device)
        where = f" (trial {number})"
        if isinstance(trial, Verdict):
            trial.message += where
            return trial, saved, worst, line
        verdict = first_rejection(trial, where=where)
        if verdict is not None:
            return verdict, saved, worst, line
        cmp = compare_outputs(trial.new_out, trial.ref_out, atol=atol, rtol=rtol)
        if not cmp.correct:
            message = f"incorrect{where}: {cmp.message}"
            return (
                Verdict("incorrect", True, False, max_abs_err=cmp.max_abs_err, message=message),
                saved,
                worst,
                line,
            )
        worst = max(worst, cmp.max_abs_err or 0.0)
        previous = None  # the older pair goes before the new one is copied
        previous = (clone(trial.new_out), clone(trial.ref_out))
        del trial, cmp, inputs, views
    return None, saved, worst, line


def _observe_trial(
    session: Session,
    model: Any,
    inputs: list[Any],
    views: list[Any],
    saved: list[Any],
    previous: Any,
    device: Any,
) -> Trial | Verdict:
    """The reference on the judge's inputs, the candidate (in its runner) on the shared copy; what the
    judge's guards look at, or the verdict of what the runner observed (a guard, a mismatch)."""
    import torch

    ref_out = model(*inputs)
    ref_mutated = [
        isinstance(x, torch.Tensor) and not torch.equal(x, s) for x, s in zip(inputs, saved, strict=True)
    ]
    ref_aliases = any(same_storage(o, x) for o in tensors(ref_out) for x in tensors(inputs))
    slots = session.slots_like(ref_out)
    poison(slots)
    sync(device)
    reply = session.runner.request("trial", "trial", ref=meta(ref_out), ref_aliases=ref_aliases)
    if reply.get("rejection"):
        return runner_rejection(reply["rejection"])
    if reply.get("mismatch"):
        return Verdict("incorrect", True, False, message=f"incorrect: {str(reply['mismatch'])[:500]}")
    new_out = rebuild(ref_out, [s.clone() for s in slots], list(reply.get("values") or []))
    return Trial(
        inputs=views,
        saved=saved,
        ref_mutated=ref_mutated,
        ref_aliases=ref_aliases,
        ref_out=ref_out,
        new_out=new_out,
        device_type=device.type,
        threads_before=0,  # counted in the runner
        threads_after=0,
        previous=previous,
    )


def _launch_check(
    session: Session, kernel_names: list[str], flags: list[str], log: list[str]
) -> Verdict | None:
    """One profiled forward in the runner: the rejection when none of the candidate's kernels ran, else None
    (flags and log lines are appended)."""
    started = time.perf_counter()
    profile = session.runner.request("launch", "launch", kernel_names=kernel_names).get("profile")
    log.append(
        f"kernel launch check: one profiled forward in the runner, {time.perf_counter() - started:.2f} s"
    )
    if not isinstance(profile, dict):
        flags.append(FLAG_LAUNCH_NOT_VERIFIED)
        log.append("kernel launch check: the profiler recorded no CUDA activity")
        return None
    ours, total = float(profile.get("ours", 0)), float(profile.get("total", 0))
    names = sorted(str(n)[:80] for n in list(profile.get("names") or [])[:200])
    log.append(f"kernels launched: {', '.join(names) or 'none'}")
    verdict = first_rejection(Launch(ours, kernel_names), log="\n".join(log))
    if verdict is not None:
        return verdict
    share = ours / total if total > 0 else 1.0
    log.append(f"custom kernels: {share:.0%} of GPU time in forward()")
    if share < 0.1:
        flags.append(FLAG_CUSTOM_KERNELS_MINOR)
    return None


def _timed_verdict(
    session: Session,
    model: Any,
    ref: ModuleType,
    device: Any,
    input_bytes: int,
    tolerance: tuple[float, float],
    worst: float,
    flags: list[str],
    log: list[str],
    device_name: str | None,
    stop_below: float | None = None,
) -> Verdict:
    """Time the reference here and the candidate from the judge (go/done round trips, outputs checked after
    each), round by round on the same fresh input set (:class:`Draws`); the verdict with the speedup.
    ``stop_below``: the early stop of :func:`dice.validator.judge.time_rounds` (flagged, and said)."""
    rounds = WARMUP + TIMING_TRIALS
    # drawn on the device, whatever the size: every round's set, on the CPU, would take minutes (kbsetup)
    draws = Draws(
        lambda seed: generate_inputs(ref, device, seed, cpu_limit=0)[0],
        rounds,
        max_kept=MAX_KEPT_SETS if _fits(device, input_bytes) else 1,
    )
    timed = time_rounds(
        session,
        model,
        draws,
        l2_flusher(device),
        tolerance,
        warmup=WARMUP,
        trials=TIMING_TRIALS,
        stop_below=stop_below,
    )
    draws.close()
    if isinstance(timed, Mismatch) and timed.unwritten:
        return rejected(
            "outputs_not_ready",
            f"the outputs read back after 'done' are not all written ({timed.message})",
            where=f" (timing round {timed.round})",
            log="\n".join(log),
        )
    if isinstance(timed, Mismatch):  # a fresh input set of the timing rounds that the candidate gets wrong
        return Verdict(
            "incorrect",
            True,
            False,
            message=f"incorrect (timing round {timed.round}, a fresh input set): {timed.message}",
            log="\n".join(log),
        )
    ref_t, new_t = timed
    log += _timing_lines(ref_t, new_t)
    trials = int(new_t.get("trials", TIMING_TRIALS))
    log.append(f"device: {device_name}; {WARMUP} warm-up, {trials} trials, L2 flushed; {draws.describe}")
    speedup = ref_t["mean_ms"] / new_t["mean_ms"] if new_t["mean_ms"] > 0 else None
    message = f"correct ({CORRECTNESS_TRIALS} trials, atol={tolerance[0]:g}); "
    message += f"{speedup:.2f}x vs PyTorch eager ({ref_t['mean_ms']:.4f} ms -> {new_t['mean_ms']:.4f} ms)"
    if new_t.get("stopped_early"):
        flags.append(FLAG_TIMING_STOPPED)
        message += (
            f"; timing stopped after {trials} of {TIMING_TRIALS} trials (below the {stop_below:g}x cut-off "
            f"asked for; outputs checked in the {WARMUP + trials} rounds run)"
        )
    extra_flags, note = speedup_flags(speedup)
    flags += extra_flags
    message += note
    return Verdict(
        "correct",
        True,
        True,
        speedup=speedup,
        ref_ms=ref_t["mean_ms"],
        new_ms=new_t["mean_ms"],
        max_abs_err=worst,
        message=message,
        log="\n".join(log),
        flags=flags,
    )


def _timing_lines(ref_t: dict[str, Any], new_t: dict[str, Any]) -> list[str]:
    """The verdict log's two timing lines: the reference's and the candidate's summaries."""
    return [
        f"reference (eager, live, host clock): mean {ref_t['mean_ms']:.5f} ms, "
        f"median {ref_t['median_ms']:.5f}, std {ref_t['std_ms']:.5f} "
        f"(an empty synchronisation, {ref_t['baseline_ms']:.5f} ms, subtracted)",
        f"candidate (timed by the judge, go/done): mean {new_t['mean_ms']:.5f} ms, median "
        f"{new_t['median_ms']:.5f}, std {new_t['std_ms']:.5f} (an empty round trip, "
        f"{new_t['baseline_ms']:.5f} ms, subtracted); outputs checked after every round",
    ]


def _fits(device: Any, input_bytes: int) -> bool:
    import torch

    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return input_bytes * 3 < free * 0.3
