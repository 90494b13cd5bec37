"""The KernelBench path, run inside a worker.

Protocol (KernelBench's, made stricter): ``Model`` and ``ModelNew`` are built from the same seed and init
inputs; 5 correctness trials with fresh seeded inputs (written into the same buffers, so a cache keyed on
pointers is caught); shape/dtype check and ``allclose`` at 1e-2 (``strict``: 1e-4); then CUDA-event timing of
both (3 warm-up calls, 100 trials, L2 flushed before each, inputs rotated), the eager reference timed live in
the same run. Inputs are generated on the GPU under ``torch.device("cuda")`` (CPU generation of KernelBench's
multi-GB inputs takes seconds per trial); dtypes are kept, so integer inputs stay integers.

Extensions built with ``load_inline`` are cached on disk by the hash of their sources and flags
(``<cache>/torch_ext/<hash>``): identical sources in any later candidate, worker or process load in well under
a second instead of a full nvcc + C++ build.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import random
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dice.validator.compile import TORCH_HEADER_PREFIXES, nvrtc_compile
from dice.validator.guards import GuardHit, analyze_candidate, static_guards
from dice.validator.paths import default_arch, source_hash
from dice.validator.reference import check_reference
from dice.validator.verdict import (
    FLAG_CUSTOM_KERNELS_MINOR,
    FLAG_LAUNCH_NOT_VERIFIED,
    FLAG_NOT_RUN,
    FLAG_SPEEDUP_OVER_10X,
    Verdict,
)

if TYPE_CHECKING:
    from dice.validator.worker import WorkerContext

SEED = 42
CORRECTNESS_TRIALS = 5
WARMUP = 3
TIMING_TRIALS = 100
ATOL = RTOL = 1e-2
STRICT_ATOL = STRICT_RTOL = 1e-4
# Host-synchronised time may exceed event time by launch overhead; far beyond that, work escaped the stream.
SIDE_STREAM_FACTOR = 2.0
SIDE_STREAM_SLACK_MS = 0.5


def rejected(hit: GuardHit, *, compiled: bool = False) -> Verdict:
    return Verdict("rejected", compiled, None, message=f"rejected by guard {hit.describe()}")


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
        v = rejected(hits[0])
        v.log = "\n".join(h.describe() for h in hits)
        return v, False
    if not ctx.gpu:
        return _static_compile_check(info, strict), False
    return _run_on_gpu(ctx, ref_src, cand_src, strict, timing)


def _static_compile_check(info: Any, strict: bool) -> Verdict:
    """Without a GPU, what can honestly be checked: Python syntax, static guards and the device code."""
    from dice.cuda_source import extract_device_code

    checked = ["Python syntax", "static honesty guards"]
    not_checked = [
        "the torch extension build (host code, load_inline)",
        "correctness",
        "timing",
        "dynamic guards",
    ]
    logs: list[str] = []
    unresolved = [ext for ext in info.extensions if not ext.resolved]
    for i, ext in enumerate(e for e in info.extensions if e.resolved):
        for j, cuda in enumerate(ext.cuda_sources):
            device = extract_device_code(cuda)
            result = nvrtc_compile(
                device.source,
                arch=default_arch(),
                line_map=device.line_map,
                display_name=f"cuda_sources[{i}.{j}]",
                stub_header_prefixes=TORCH_HEADER_PREFIXES,
            )
            logs.append(result.log)
            if not result.ok:
                return Verdict(
                    "compile_error",
                    False,
                    message="CUDA device code does not compile (NVRTC): " + _first_line(result.log),
                    log=result.log,
                    diagnostics=result.diagnostics,
                )
        if ext.cuda_sources:
            checked.append(f"device code of load_inline at line {ext.line} with NVRTC (sm_{default_arch()})")
    if unresolved:
        not_checked.append(
            "CUDA source built at run time (line " + ", ".join(str(e.line) for e in unresolved) + ")"
        )
    tol = "1e-4" if strict else "1e-2"
    message = (
        f"compiled (no GPU): checked {', '.join(checked)}; not checked: {', '.join(not_checked)} "
        f"(tolerance {tol} applies when run on a GPU)"
    )
    return Verdict(
        "compiled", True, None, message=message, log="\n".join(x for x in logs if x), flags=[FLAG_NOT_RUN]
    )


def _first_line(log: str) -> str:
    for line in log.splitlines():
        if "error" in line:
            return line.strip()
    return log.strip().splitlines()[0] if log.strip() else "failed"


# ------------------------------------------------------------------------------------------------- builds
@contextlib.contextmanager
def cached_extension_builds(cache_root: Path, records: list[dict[str, Any]]) -> Iterator[None]:
    """Route ``load_inline`` to a build folder keyed by the hash of its sources and flags."""
    import torch
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        flags = {k: v for k, v in kwargs.items() if k not in ("verbose", "build_directory")}
        key = source_hash(
            name,
            json.dumps([cpp_sources, cuda_sources, [repr(a) for a in args]], default=repr),
            json.dumps(sorted((k, repr(v)) for k, v in flags.items())),
            torch.__version__,
            torch.version.cuda or "",
            _arch_list(),
        )
        build_dir = cache_root / "torch_ext" / key
        build_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps([cpp_sources, cuda_sources])
        # A module name tied to the hash keeps two candidates that both say "my_ext" apart in one process,
        # unless the source hard-codes its own PYBIND11_MODULE name.
        unique = "PYBIND11_MODULE(" not in text or "TORCH_EXTENSION_NAME" in text
        ext_name = f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{key[:12]}" if unique else name
        cached = any(build_dir.glob("*.so"))
        kwargs.update(build_directory=str(build_dir), verbose=False)
        start = time.perf_counter()
        record: dict[str, Any] = {
            "name": name,
            "key": key,
            "cached": cached,
            "sources": cuda_sources or cpp_sources,
        }
        records.append(record)
        try:
            return original(ext_name, cpp_sources, cuda_sources, *args, **kwargs)
        finally:
            record["seconds"] = time.perf_counter() - start

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def _arch_list() -> str:
    import os

    return os.environ.get("TORCH_CUDA_ARCH_LIST", "")


def _import_source(src: str, path: Path, module_name: str) -> ModuleType:
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _kernel_strings(src: str) -> list[str]:
    import ast

    return [
        node.value
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value
    ]


def _kernel_names(sources: list[str]) -> list[str]:
    from dice.cuda_source import parse_document

    names: list[str] = []
    for src in sources:
        for fn in parse_document(src).functions:
            if fn.kind == "global" and fn.name and fn.name not in names:
                names.append(fn.name)
    return names


# ------------------------------------------------------------------------------------------------- GPU run
def _run_on_gpu(
    ctx: WorkerContext, ref_src: str, cand_src: str, strict: bool, timing: bool
) -> tuple[Verdict, bool]:
    import torch

    task_dir = ctx.task_dir()
    key = source_hash(cand_src, length=12)
    records: list[dict[str, Any]] = []
    device = torch.device("cuda", torch.cuda.current_device())
    stage = "importing the reference"
    build_start = time.perf_counter()
    try:
        ref = _import_source(ref_src, task_dir / "reference.py", f"dice_ref_{key}")
    except Exception as exc:  # noqa: BLE001
        return Verdict(
            "runtime_error",
            False,
            message=f"the reference failed to import: {exc}",
            log=traceback.format_exc(),
        ), True
    try:
        with cached_extension_builds(ctx.cache_dir, records):
            stage = "building the candidate (import, load_inline)"
            cand = _import_source(cand_src, task_dir / "candidate.py", f"dice_cand_{key}")
            stage = "constructing Model and ModelNew"
            with torch.device(device):
                torch.manual_seed(SEED)
                init_inputs = list(ref.get_init_inputs())
                torch.manual_seed(SEED)
                model = ref.Model(*init_inputs).to(device).eval()
                torch.manual_seed(SEED)
                model_new = cand.ModelNew(*init_inputs).to(device).eval()
    except Exception as exc:  # noqa: BLE001 - a build or import failure is the candidate's compile error
        log = traceback.format_exc()
        status = "compile_error" if stage.startswith("building") else "runtime_error"
        return Verdict(
            status, status != "compile_error", message=f"{stage} failed: {_short(exc)}", log=log
        ), True
    build_s = time.perf_counter() - build_start
    build_log = (
        "builds: "
        + ", ".join(
            f"{r['name']} ({'cached' if r['cached'] else 'built'} {r.get('seconds', 0):.1f} s)"
            for r in records
        )
        if records
        else "builds: none"
    )
    violations = ctx.integrity.violations()
    if violations:
        return Verdict(
            "rejected",
            True,
            message="rejected by guard monkey_patch: importing the candidate replaced "
            + ", ".join(violations[:5]),
        ), True
    # Kernel names for the launch check: sources that load_inline really received, plus every string
    # constant holding a kernel (CuPy RawKernel sources, torch.utils.cpp_extension.load files excepted).
    sources = [str(s) for r in records for s in _as_list(r["sources"])] + _kernel_strings(cand_src)
    kernel_names = _kernel_names(sources)
    ctx.acquire_gpu()
    try:
        with torch.no_grad():
            verdict = _check_and_time(ctx, ref, model, model_new, device, strict, timing, kernel_names)
    except Exception as exc:  # noqa: BLE001 - illegal address, launch failure ...: the context is unusable
        return Verdict(
            "runtime_error", True, message=f"runtime error: {_short(exc)}", log=traceback.format_exc()
        ), True
    verdict.log = (f"{build_log}; build+import {build_s:.1f} s\n{verdict.log}").strip()
    violations = ctx.integrity.violations()
    if violations:
        return Verdict(
            "rejected",
            True,
            message="rejected by guard monkey_patch: the candidate replaced " + ", ".join(violations[:5]),
        ), True
    for name in [n for n in sys.modules if n.endswith(key) and n.startswith("dice_")]:
        del sys.modules[name]
    del model, model_new
    torch.cuda.empty_cache()
    return verdict, False


def _short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _tensors(obj: Any) -> list[Any]:
    import torch

    from dice.validator.gpu import flatten

    return [x for x in flatten(obj) if isinstance(x, torch.Tensor)]


def _same_storage(a: Any, b: Any) -> bool:
    try:
        return (
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.untyped_storage().nbytes() > 0
        )
    except Exception:  # noqa: BLE001 - tensors without storage (subclasses) are caught by the type guard
        return False


def _clone(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(x) for x in obj)
    return obj


def _generate_inputs(ref: ModuleType, device: Any, seed: int) -> list[Any]:
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(ref.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


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
    import torch

    from dice.validator.gpu import L2Flusher, compare_outputs, host_synchronized_ms, time_cuda

    atol, rtol = (STRICT_ATOL, STRICT_RTOL) if strict else (ATOL, RTOL)
    rng = random.Random(SEED)
    seeds = [rng.randrange(2**31) for _ in range(CORRECTNESS_TRIALS)]
    inputs: list[Any] | None = None
    previous: tuple[Any, Any] | None = None
    worst = 0.0
    for trial, seed in enumerate(seeds):
        fresh = _generate_inputs(ref, device, seed)
        if inputs is None:
            inputs = fresh
        else:  # same buffers, new values: a cache keyed on data_ptr returns stale results
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
        del fresh
        saved = [_clone(x) for x in inputs]
        ref_out = model(*inputs)
        ref_mutated = [
            isinstance(x, torch.Tensor) and not torch.equal(x, s) for x, s in zip(inputs, saved, strict=True)
        ]
        for x, s, m in zip(inputs, saved, ref_mutated, strict=True):
            if m:
                x.copy_(s)
        ref_aliases = any(_same_storage(o, x) for o in _tensors(ref_out) for x in _tensors(inputs))
        threads_before = threading.active_count()
        new_out = model_new(*inputs)
        torch.cuda.synchronize()
        where = f" (trial {trial + 1})"

        if threading.active_count() > threads_before:
            return Verdict(
                "rejected",
                True,
                message="rejected by guard side_thread: the candidate started a thread" + where,
            )
        for out in _tensors(new_out):
            if type(out) is not torch.Tensor or out.is_meta or out.device.type != device.type:
                kind = type(out).__name__ if type(out) is not torch.Tensor else f"a {out.device.type} tensor"
                return Verdict(
                    "rejected",
                    True,
                    message="rejected by guard fake_tensor: output is "
                    + kind
                    + " (must be a plain, materialised CUDA torch.Tensor)"
                    + where,
                )
        for o, r in zip(_tensors(new_out), _tensors(ref_out), strict=False):
            if _narrower(o.dtype, r.dtype):
                return Verdict(
                    "rejected",
                    True,
                    message=f"rejected by guard precision_downgrade: output is {o.dtype}, the reference's "
                    f"{r.dtype}" + where,
                )
        if not ref_aliases and any(_same_storage(o, x) for o in _tensors(new_out) for x in _tensors(inputs)):
            return Verdict(
                "rejected",
                True,
                message="rejected by guard output_aliases_input: the output shares "
                "memory with an input, the reference's does not" + where,
            )
        for i, (x, s, m) in enumerate(zip(inputs, saved, ref_mutated, strict=True)):
            if isinstance(x, torch.Tensor) and not m and not torch.equal(x, s):
                return Verdict(
                    "rejected",
                    True,
                    message=f"rejected by guard inputs_mutated: input {i} was modified "
                    "in place (the reference leaves it intact)" + where,
                )
        if previous is not None:
            prev_new, prev_ref = previous
            if _all_equal(new_out, prev_new) and not _all_equal(ref_out, prev_ref):
                return Verdict(
                    "rejected",
                    True,
                    message="rejected by guard outputs_cached: the output did not change "
                    "when the inputs did (cached across calls)" + where,
                )
        cmp = compare_outputs(new_out, ref_out, atol=atol, rtol=rtol)
        if not cmp.correct:
            return Verdict(
                "incorrect",
                True,
                False,
                max_abs_err=cmp.max_abs_err,
                message=f"incorrect{where}: {cmp.message}",
            )
        worst = max(worst, cmp.max_abs_err or 0.0)
        previous = (_clone(new_out), _clone(ref_out))
        del ref_out, new_out, saved
    assert inputs is not None
    previous = None

    flags: list[str] = []
    log: list[str] = [
        f"correctness: {CORRECTNESS_TRIALS} trials passed at atol={atol:g} rtol={rtol:g}, "
        f"max abs err {worst:.3g}"
    ]
    launch = _launched_kernels(model_new, inputs, kernel_names)
    if launch is None:
        flags.append(FLAG_LAUNCH_NOT_VERIFIED)
        log.append("kernel launch check: the profiler recorded no CUDA activity")
    else:
        ours, total, names = launch
        log.append(f"kernels launched: {', '.join(sorted(names)) or 'none'}")
        if ours == 0:
            return Verdict(
                "rejected",
                True,
                None,
                message="rejected by guard kernel_never_called: none of the "
                f"candidate's kernels ({', '.join(kernel_names) or 'none found'}) ran in forward()",
                log="\n".join(log),
            )
        share = ours / total if total > 0 else 1.0
        log.append(f"custom kernels: {share:.0%} of GPU time in forward()")
        if share < 0.1:
            flags.append(FLAG_CUSTOM_KERNELS_MINOR)
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

    arg_sets = [inputs]
    input_bytes = sum(x.numel() * x.element_size() for x in _tensors(inputs))
    free, _ = torch.cuda.mem_get_info()
    if input_bytes * 3 < free * 0.3:
        arg_sets += [_generate_inputs(ref, device, SEED + k) for k in (101, 202)]
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
    if wall > SIDE_STREAM_FACTOR * new_t.median_ms + SIDE_STREAM_SLACK_MS:
        return Verdict(
            "rejected",
            True,
            True,
            message=f"rejected by guard side_stream: a synchronised call takes "
            f"{wall:.3f} ms but the timed stream sees {new_t.median_ms:.3f} ms (work escapes the timed "
            "stream)",
            log="\n".join(log),
        )
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


def _narrower(dtype: Any, ref_dtype: Any) -> bool:
    """Whether an output dtype holds less precision than the floating reference dtype (fp16 for fp32 ...)."""
    import torch

    if dtype == ref_dtype or not ref_dtype.is_floating_point:
        return False
    if not dtype.is_floating_point:
        return True
    return torch.finfo(dtype).bits < torch.finfo(ref_dtype).bits or (
        torch.finfo(dtype).bits == torch.finfo(ref_dtype).bits
        and torch.finfo(dtype).eps > torch.finfo(ref_dtype).eps
    )


def speedup_flags(speedup: float | None) -> tuple[list[str], str]:
    """Flags and a message suffix for a measured speedup (over 10x is flagged for review)."""
    if speedup is not None and speedup > 10:
        return [FLAG_SPEEDUP_OVER_10X], "; speedup over 10x: flagged for review"
    return [], ""


def _all_equal(a: Any, b: Any) -> bool:
    import torch

    from dice.validator.gpu import flatten

    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


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
