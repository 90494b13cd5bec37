"""The KernelBench path, run inside a worker.

Protocol (KernelBench's, made stricter): ``Model`` and ``ModelNew`` are built as KernelBench builds them, on
the CPU, each after ``torch.manual_seed(42)``, from the same init inputs, then moved to the GPU
(:mod:`dice.validator.kbsetup`); 5 correctness trials with fresh seeded inputs (written into the same
buffers, so a cache keyed on pointers is caught); shape/dtype check, ``allclose`` at 1e-2 (``strict``: 1e-4)
and the degenerate-output check of :func:`dice.validator.gpu.compare_outputs` (a constant, all-zero or far
too small output fails even inside the tolerance); then CUDA-event timing of both (3 warm-up calls, 100
trials, L2 flushed before each, inputs rotated), the eager reference timed live in the same run. Inputs are
drawn on the CPU under the trial's seed and moved, as KernelBench does, except large ones (over
``kbsetup.CPU_INPUT_ELEMENTS`` elements: CPU generation of KernelBench's multi-GB inputs takes seconds per
trial), which are drawn on the GPU under the same seed; the log says which. Dtypes are kept, so integer
inputs stay integers.

The pieces live beside this module: builds and the extension cache in :mod:`dice.validator.builds`, the check
without a GPU in :mod:`dice.validator.kbstatic`, the static guards in :mod:`dice.validator.guards` and the
dynamic ones (checked here, in the order of their table) in :mod:`dice.validator.runtime_guards`.
"""

from __future__ import annotations

import random
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dice.validator.builds import built_kernel_names, cached_extension_builds, describe_builds, import_source
from dice.validator.guards import analyze_candidate, static_guards
from dice.validator.kbsetup import SEED, construct_models, generate_inputs
from dice.validator.kbstatic import static_compile_check
from dice.validator.paths import source_hash
from dice.validator.reference import check_reference
from dice.validator.runtime_guards import (
    Launch,
    Replaced,
    Timed,
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
    if not ctx.gpu or not_run is not None:
        return static_compile_check(info, strict, not_run=not_run), False
    return _run_on_gpu(ctx, ref_src, cand_src, strict, timing)


# ------------------------------------------------------------------------------------------------- GPU run
def _run_on_gpu(
    ctx: WorkerContext, ref_src: str, cand_src: str, strict: bool, timing: bool
) -> tuple[Verdict, bool]:
    import torch

    task_dir = ctx.task_dir()
    key = source_hash(cand_src, length=12)
    records: list[dict[str, Any]] = []
    device = torch.device("cuda", torch.cuda.current_device())
    build_start = time.perf_counter()
    built = _build_models(ctx, ref_src, cand_src, task_dir, key, device, records)
    if isinstance(built, Verdict):
        return built, True
    ref, model, model_new, construction = built
    del built
    build_log = f"{describe_builds(records)}; build+import {time.perf_counter() - build_start:.1f} s"
    build_log += f"\n{construction}"
    verdict = first_rejection(Replaced("importing the candidate", ctx.integrity.violations()))
    if verdict is not None:
        return verdict, True
    kernel_names = built_kernel_names(records, cand_src)
    ctx.acquire_gpu()
    try:
        with torch.no_grad():
            verdict = _check_and_time(ctx, ref, model, model_new, device, strict, timing, kernel_names)
    except Exception as exc:  # noqa: BLE001 - illegal address, launch failure ...: the context is unusable
        return Verdict(
            "runtime_error", True, message=f"runtime error: {_short(exc)}", log=traceback.format_exc()
        ), True
    verdict.log = (f"{build_log}\n{verdict.log}").strip()
    patched = first_rejection(Replaced("the candidate", ctx.integrity.violations()))
    if patched is not None:
        return patched, True
    for name in [n for n in sys.modules if n.endswith(key) and n.startswith("dice_")]:
        del sys.modules[name]
    del model, model_new
    torch.cuda.empty_cache()
    return verdict, False


def _build_models(
    ctx: WorkerContext,
    ref_src: str,
    cand_src: str,
    task_dir: Path,
    key: str,
    device: Any,
    records: list[dict[str, Any]],
) -> tuple[ModuleType, Any, Any, str] | Verdict:
    """Import the reference and the candidate (building its extensions) and construct ``Model`` and
    ``ModelNew`` as KernelBench does (:func:`dice.validator.kbsetup.construct_models`): ``(reference module,
    model, model_new, construction log line)``, or the failure's verdict when one step fails."""
    stage = "importing the reference"
    try:
        ref = import_source(ref_src, task_dir / "reference.py", f"dice_ref_{key}")
    except Exception as exc:  # noqa: BLE001
        return Verdict(
            "runtime_error",
            False,
            message=f"the reference failed to import: {exc}",
            log=traceback.format_exc(),
        )
    try:
        with cached_extension_builds(ctx.cache_dir, records):
            stage = "building the candidate (import, load_inline)"
            cand = import_source(cand_src, task_dir / "candidate.py", f"dice_cand_{key}")
            stage = "constructing Model and ModelNew"
            model, model_new, construction = construct_models(ref, cand, device, SEED)
    except Exception as exc:  # noqa: BLE001 - a build or import failure is the candidate's compile error
        log = traceback.format_exc()
        status = "compile_error" if stage.startswith("building") else "runtime_error"
        return Verdict(status, status != "compile_error", message=f"{stage} failed: {_short(exc)}", log=log)
    return ref, model, model_new, construction


def _short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def _check_and_time(
    ctx: WorkerContext,
    ref: ModuleType,
    model: Any,
    model_new: Any,
    device: Any,
    strict: bool,
    timing: bool,
    kernel_names: list[str],
) -> Verdict:
    """Correctness trials, the kernel-launch check, then timing; the first guard that fires decides."""
    atol, rtol = (STRICT_ATOL, STRICT_RTOL) if strict else (ATOL, RTOL)
    failed, inputs, worst, drawn = _correctness_trials(ref, model, model_new, device, atol, rtol)
    if failed is not None:
        failed.log = f"{drawn}\n{failed.log}".strip()
        return failed
    flags: list[str] = []
    log: list[str] = [
        drawn,
        f"correctness: {CORRECTNESS_TRIALS} trials passed at atol={atol:g} rtol={rtol:g}, "
        f"max abs err {worst:.3g}",
    ]
    never_called = _launch_check(model_new, inputs, kernel_names, flags, log)
    if never_called is not None:
        return never_called
    if not timing:
        return Verdict(
            "correct",
            True,
            True,
            max_abs_err=worst,
            message=f"correct ({CORRECTNESS_TRIALS} trials, atol={atol:g}); timing skipped",
            log="\n".join(log),
            flags=flags,
        )
    return _timed_verdict(ctx, ref, model, model_new, device, inputs, atol, worst, flags, log)


def _correctness_trials(
    ref: ModuleType, model: Any, model_new: Any, device: Any, atol: float, rtol: float
) -> tuple[Verdict | None, list[Any], float, str]:
    """(the verdict of the first trial that fails or None, the inputs of the last trial, worst abs error,
    the log line saying where the inputs were drawn)."""
    from dice.validator.gpu import compare_outputs

    rng = random.Random(SEED)
    seeds = [rng.randrange(2**31) for _ in range(CORRECTNESS_TRIALS)]
    inputs: list[Any] | None = None
    previous: tuple[Any, Any] | None = None
    worst = 0.0
    drawn: list[str] = []
    for number, seed in enumerate(seeds, 1):
        fresh, where_drawn = generate_inputs(ref, device, seed)
        if where_drawn not in drawn:
            drawn.append(where_drawn)
        inputs = _refill(inputs, fresh)
        del fresh
        trial = _observe_trial(model, model_new, inputs, previous, device.type)
        where = f" (trial {number})"
        line = "inputs: " + "; ".join(drawn)
        verdict = first_rejection(trial, where=where)
        if verdict is not None:
            return verdict, inputs, worst, line
        cmp = compare_outputs(trial.new_out, trial.ref_out, atol=atol, rtol=rtol)
        if not cmp.correct:
            return (
                Verdict(
                    "incorrect",
                    True,
                    False,
                    max_abs_err=cmp.max_abs_err,
                    message=f"incorrect{where}: {cmp.message}",
                ),
                inputs,
                worst,
                line,
            )
        worst = max(worst, cmp.max_abs_err or 0.0)
        previous = (clone(trial.new_out), clone(trial.ref_out))
        del trial
    assert inputs is not None
    return None, inputs, worst, "inputs: " + "; ".join(drawn)


def _refill(inputs: list[Any] | None, fresh: list[Any]) -> list[Any]:
    """The first trial's inputs, later ones written into the same buffers: same buffers, new values, so a
    cache keyed on ``data_ptr`` returns stale results."""
    import torch

    if inputs is None:
        return fresh
    for i, (old, new) in enumerate(zip(inputs, fresh, strict=True)):
        if (
            isinstance(old, torch.Tensor)
            and isinstance(new, torch.Tensor)
            and old.shape == new.shape
            and old.dtype == new.dtype
        ):
            old.copy_(new)
        else:
            inputs[i] = new
    return inputs


def _observe_trial(
    model: Any, model_new: Any, inputs: list[Any], previous: tuple[Any, Any] | None, device_type: str
) -> Trial:
    """Run the reference, undo its in-place changes, run the candidate on the same inputs, and record what
    the guards look at."""
    import torch

    saved = [clone(x) for x in inputs]
    ref_out = model(*inputs)
    ref_mutated = [
        isinstance(x, torch.Tensor) and not torch.equal(x, s) for x, s in zip(inputs, saved, strict=True)
    ]
    for x, s, m in zip(inputs, saved, ref_mutated, strict=True):
        if m:
            x.copy_(s)
    ref_aliases = any(same_storage(o, x) for o in tensors(ref_out) for x in tensors(inputs))
    threads_before = threading.active_count()
    new_out = model_new(*inputs)
    torch.cuda.synchronize()
    return Trial(
        inputs=inputs,
        saved=saved,
        ref_mutated=ref_mutated,
        ref_aliases=ref_aliases,
        ref_out=ref_out,
        new_out=new_out,
        device_type=device_type,
        threads_before=threads_before,
        threads_after=threading.active_count(),
        previous=previous,
    )


def _launch_check(
    model_new: Any, inputs: list[Any], kernel_names: list[str], flags: list[str], log: list[str]
) -> Verdict | None:
    """Profile one forward: the rejection when none of the candidate's kernels ran, else None (flags and
    log lines are appended)."""
    launch = _launched_kernels(model_new, inputs, kernel_names)
    if launch is None:
        flags.append(FLAG_LAUNCH_NOT_VERIFIED)
        log.append("kernel launch check: the profiler recorded no CUDA activity")
        return None
    ours, total, names = launch
    log.append(f"kernels launched: {', '.join(sorted(names)) or 'none'}")
    verdict = first_rejection(Launch(ours, kernel_names), log="\n".join(log))
    if verdict is not None:
        return verdict
    share = ours / total if total > 0 else 1.0
    log.append(f"custom kernels: {share:.0%} of GPU time in forward()")
    if share < 0.1:
        flags.append(FLAG_CUSTOM_KERNELS_MINOR)
    return None


def _timed_verdict(
    ctx: WorkerContext,
    ref: ModuleType,
    model: Any,
    model_new: Any,
    device: Any,
    inputs: list[Any],
    atol: float,
    worst: float,
    flags: list[str],
    log: list[str],
) -> Verdict:
    """Time the reference and the candidate on the same input sets; the side-stream guard, then the
    verdict with the speedup."""
    import torch

    from dice.validator.gpu import L2Flusher, host_synchronized_ms, time_cuda

    arg_sets = [inputs]
    input_bytes = sum(x.numel() * x.element_size() for x in tensors(inputs))
    free, _ = torch.cuda.mem_get_info()
    if input_bytes * 3 < free * 0.3:
        arg_sets += [generate_inputs(ref, device, SEED + k)[0] for k in (101, 202)]
    flush = L2Flusher(device)
    ref_t = time_cuda(model, arg_sets, warmup=WARMUP, trials=TIMING_TRIALS, flush=flush)
    new_t = time_cuda(model_new, arg_sets, warmup=WARMUP, trials=TIMING_TRIALS, flush=flush)
    wall = host_synchronized_ms(model_new, inputs)
    log.append(
        f"reference (eager, live): mean {ref_t.mean_ms:.5f} ms, median {ref_t.median_ms:.5f}, "
        f"std {ref_t.std_ms:.5f}"
    )
    log.append(
        f"candidate: mean {new_t.mean_ms:.5f} ms, median {new_t.median_ms:.5f}, std {new_t.std_ms:.5f}; "
        f"host-synchronised {wall:.5f} ms"
    )
    log.append(
        f"device: {ctx.device_name}; {WARMUP} warm-up, {TIMING_TRIALS} trials, L2 flushed, "
        f"{len(arg_sets)} input set(s)"
    )
    verdict = first_rejection(Timed(wall, new_t.median_ms), correct=True, log="\n".join(log))
    if verdict is not None:
        return verdict
    speedup = ref_t.mean_ms / new_t.mean_ms if new_t.mean_ms > 0 else None
    message = f"correct ({CORRECTNESS_TRIALS} trials, atol={atol:g}); "
    message += f"{speedup:.2f}x vs PyTorch eager ({ref_t.mean_ms:.4f} ms -> {new_t.mean_ms:.4f} ms)"
    extra_flags, note = speedup_flags(speedup)
    flags += extra_flags
    message += note
    return Verdict(
        "correct",
        True,
        True,
        speedup=speedup,
        ref_ms=ref_t.mean_ms,
        new_ms=new_t.mean_ms,
        max_abs_err=worst,
        message=message,
        log="\n".join(log),
        flags=flags,
    )


def _launched_kernels(
    model_new: Any, inputs: list[Any], kernel_names: list[str]
) -> tuple[float, float, set[str]] | None:
    """(custom kernel time, total kernel time, kernel names) of one profiled forward, or None without data."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model_new(*inputs)
        torch.cuda.synchronize()
    patterns = [re.compile(rf"(?<![\w]){re.escape(n)}(?![\w])") for n in kernel_names]
    ours = total = 0.0
    names: set[str] = set()
    for event in prof.events():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if event.name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset")):
            continue
        duration = float(event.time_range.elapsed_us())
        names.add(event.name.split("(")[0][:80])
        total += duration
        if any(p.search(event.name) for p in patterns):
            ours += max(duration, 1e-3)
    if not names:
        return None
    return ours, total, names
