"""GPU-side helpers used inside worker processes: torch-friendly CuPy modules, CUDA-event timing, comparison.

Nothing here runs in the caller's process; torch and CuPy are imported lazily by the worker.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class TorchKernel:
    """A CuPy ``RawKernel`` that accepts torch CUDA tensors (zero-copy views through DLPack).

    Launches go to torch's current stream, so CUDA-event timing and ``torch.cuda.synchronize`` see them.
    """

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel

    def __call__(
        self, grid: Any, block: Any, args: Sequence[Any], *, shared_mem: int = 0, stream: Any = None
    ) -> None:
        import cupy
        import torch

        converted = tuple(cupy.from_dlpack(a) if isinstance(a, torch.Tensor) else a for a in args)
        grid = grid if isinstance(grid, tuple) else (int(grid),)
        block = block if isinstance(block, tuple) else (int(block),)
        if stream is None:
            ptr = torch.cuda.current_stream().cuda_stream
            if ptr != 0:  # torch's default stream is CuPy's null stream; any other needs wrapping
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    stream = cupy.cuda.ExternalStream(ptr)
        if stream is None:
            self._kernel(grid, block, converted, shared_mem=shared_mem)
        else:
            with stream:
                self._kernel(grid, block, converted, shared_mem=shared_mem)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


class TorchModule:
    """The ``module`` handed to a dice-spec ``launch``: ``module.get_function("k")`` or ``module.k``."""

    def __init__(self, raw_module: Any) -> None:
        self._raw = raw_module

    def get_function(self, name: str) -> TorchKernel:
        return TorchKernel(self._raw.get_function(name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.get_function(name)
        except Exception as exc:  # noqa: BLE001 - CuPy raises a driver error for unknown names
            raise AttributeError(f"the compiled module has no kernel named {name!r} ({exc})") from exc


@dataclass
class Timing:
    mean_ms: float
    median_ms: float
    std_ms: float
    min_ms: float
    trials: int


class L2Flusher:
    """Overwrites a buffer twice the L2 size between timed calls, so each trial starts with a cold cache."""

    def __init__(self, device: Any = "cuda") -> None:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.buffer = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def time_cuda(
    fn: Callable[..., Any],
    arg_sets: Sequence[Sequence[Any]],
    *,
    warmup: int = 3,
    trials: int = 100,
    flush: L2Flusher | None = None,
) -> Timing:
    """Milliseconds per call from CUDA events on the current stream, after ``warmup`` calls.

    Trials rotate over ``arg_sets`` (fresh inputs) and flush L2 before each start event.
    """
    import torch

    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    for i in range(trials):
        if flush is not None:
            flush()
        starts[i].record()
        fn(*arg_sets[i % len(arg_sets)])
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing(
        mean_ms=statistics.fmean(times),
        median_ms=statistics.median(times),
        std_ms=statistics.pstdev(times),
        min_ms=min(times),
        trials=trials,
    )


def host_synchronized_ms(fn: Callable[..., Any], args: Sequence[Any], *, repeats: int = 10) -> float:
    """Median wall time of one call between device-wide synchronisations: includes work on any stream."""
    import torch

    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def flatten(obj: Any) -> list[Any]:
    """Leaves of nested tuples/lists (outputs of ``forward``, ``reference`` or ``launch``)."""
    if isinstance(obj, (tuple, list)):
        out: list[Any] = []
        for item in obj:
            out.extend(flatten(item))
        return out
    return [obj]


@dataclass
class Comparison:
    correct: bool
    max_abs_err: float | None
    message: str


def compare_outputs(new: Any, ref: Any, *, atol: float, rtol: float) -> Comparison:
    """Structure, shape and dtype must match; values must satisfy ``allclose`` (NaN never passes)."""
    import torch

    new_leaves, ref_leaves = flatten(new), flatten(ref)
    if len(new_leaves) != len(ref_leaves):
        return Comparison(
            False, None, f"output count mismatch: expected {len(ref_leaves)}, got {len(new_leaves)}"
        )
    worst = 0.0
    for i, (n, r) in enumerate(zip(new_leaves, ref_leaves, strict=True)):
        where = f"output {i}" if len(ref_leaves) > 1 else "output"
        if isinstance(r, torch.Tensor):
            if not isinstance(n, torch.Tensor):
                return Comparison(False, None, f"{where}: expected a tensor, got {type(n).__name__}")
            if tuple(n.shape) != tuple(r.shape):
                return Comparison(
                    False, None, f"{where}: shape mismatch: expected {tuple(r.shape)}, got {tuple(n.shape)}"
                )
            if n.dtype != r.dtype:
                return Comparison(
                    False,
                    None,
                    f"{where}: dtype mismatch (precision downgrade?): expected {r.dtype}, got {n.dtype}",
                )
            if n.numel() == 0:
                continue
            nd, rd = n.detach(), r.detach().to(n.device)
            if nd.is_floating_point() or nd.is_complex():
                # float32 differences are exact enough for an error report and halve the memory of float64
                # on KernelBench's multi-GB outputs; half types are widened first.
                wide = torch.promote_types(nd.dtype, torch.float32)
                diff = (nd.to(wide) - rd.to(wide)).abs()
                err = float(diff.max()) if not torch.isnan(diff).any() else math.inf
                del diff
                ok = bool(torch.allclose(nd, rd, atol=atol, rtol=rtol))
            else:
                err = (
                    float((nd.long() - rd.long()).abs().max())
                    if nd.dtype != torch.bool
                    else float((nd != rd).sum())
                )
                ok = bool(torch.equal(nd, rd))
            worst = max(worst, err)
            if not ok:
                return Comparison(
                    False,
                    worst,
                    f"{where}: values differ beyond atol={atol:g}, rtol={rtol:g} (max abs err {err:.4g})",
                )
        else:
            try:
                ok = math.isclose(float(n), float(r), rel_tol=rtol, abs_tol=atol)
            except (TypeError, ValueError):
                ok = n == r
            if not ok:
                return Comparison(False, None, f"{where}: expected {r!r}, got {n!r}")
    return Comparison(True, worst, "outputs match")
