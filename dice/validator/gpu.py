"""GPU-side helpers used inside worker processes: torch-friendly CuPy modules, the L2 flush, comparison.

Nothing here runs in the caller's process; torch and CuPy are imported lazily by the worker.
"""

from __future__ import annotations

import math
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


class L2Flusher:
    """Overwrites a buffer twice the L2 size between timed calls, so each trial starts with a cold cache."""

    def __init__(self, device: Any = "cuda") -> None:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.buffer = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def l2_flusher(device: Any) -> Callable[[], None]:
    """:class:`L2Flusher` on a CUDA device; on the CPU (the emulated path) nothing to flush."""
    if getattr(device, "type", str(device)) != "cuda":
        return lambda: None
    return L2Flusher(device)


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
    """Structure, shape and dtype must match; values must satisfy ``allclose`` (NaN never passes) and, for a
    floating output, must not be degenerate (:func:`degenerate_output`: constant, all zeros or far too small
    where the reference is not, which ``allclose`` at 1e-2 lets through when the values are small)."""
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
                err, ok, diff_norm = _float_compare(nd, rd, atol, rtol)
                degenerate = (
                    degenerate_output(nd, rd, diff_norm=diff_norm) if ok and nd.is_floating_point() else None
                )
                if degenerate is not None:
                    return Comparison(
                        False,
                        max(worst, err),
                        f"{where} {degenerate}; allclose at atol={atol:g}, rtol={rtol:g} passes it only "
                        "because the values are small",
                    )
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


# Degenerate outputs, a known KernelBench hole: at atol=1e-2 an all-zero output passes every problem whose
# values all lie under 1e-2 (softmax over 16k+ columns, whose largest value is ~3e-3; L1/L2/Frobenius norms of
# large rows; ...). A floating output whose reference has a finite value above DEGENERATE_FLOOR must also:
# * not be constant where the reference varies (max - min over REF_VARIES = 2% of max|ref|, or 4 ulps of
#   its dtype when larger): an honest kernel that rounds through bf16 (one ulp = 2^-8..2^-7 of the value) can
#   collapse values closer than that into one, never values 2% apart. A reference that is itself constant (a
#   softmax over one column is all 1) lets an equal constant pass; one element (a loss) is never "constant".
# * have an L2 norm of at least MIN_NORM_RATIO (0.5) of the reference's: zeros, or values scaled down by a
#   forgotten factor, are rejected with the ratio in the message.
# * have a relative L2 error ||new - ref|| / ||ref|| of at most MAX_REL_L2 (0.1). Honest kernels stay far
#   below: fp32 ~1e-6, TF32 matmuls/convolutions ~1e-3, bf16 rounding ~2e-3, fp16 subnormal quantisation
#   of a softmax over 393216 columns ~6e-3, so the bound leaves 15-100x of room. For outputs of magnitude ~1
#   or more, allclose at 1e-2 already bounds the error well below it, so the check only bites where the
#   values are small next to atol.
# Integer and bool outputs are compared exactly already; complex ones are left to allclose. Only the finite
# elements of the reference count (allclose has already matched infinities). The floor leaves outputs at
# rounding-noise level to allclose (a mathematically zero result computed in float32, like KernelBench
# level 2 problem 23, a mean of a GroupNorm output, ~1e-8): there an honest kernel's noise differs from the
# reference's by 100%. The smallest real KernelBench output it must keep checking is level 1 problem 23's
# softmax over 393216 columns, at most ~4e-6. Dry run on the CPU over the level 1-3 references (small
# batches): zeros and mean-constant stand-ins are rejected wherever allclose passes them and the output is
# above the floor (level 1: 23, 39; level 2: 38, 58, 84, 99), and fp64, TF32-like and bf16-like perturbed
# runs and bf16/fp16-rounded outputs of every reference pass this check.
DEGENERATE_FLOOR = 1e-6
REF_VARIES = 0.02
MIN_NORM_RATIO = 0.5
MAX_REL_L2 = 0.1


COMPARE_CHUNK = 1 << 25  # elements per step of _float_compare (128 MiB of float32)


def _float_compare(new: Any, ref: Any, atol: float, rtol: float) -> tuple[float, bool, float]:
    """(max ``|new - ref|``, inf where a difference is NaN; ``allclose``; the L2 norm of ``new - ref``) of two
    floating tensors of one shape, a chunk of :data:`COMPARE_CHUNK` elements at a time: the same answers
    as on the whole tensors (all three are elementwise or sums), with temporaries of one chunk instead of
    several copies of a multi-GB KernelBench output (problem 19's 6 GiB output ran the judge out of
    memory on the H200 with other workers on the GPU). Differences in float32 (half types widened): exact
    enough for an error report, half the memory of float64."""
    import torch

    wide = torch.promote_types(new.dtype, torch.float32)
    a, b = new.reshape(-1), ref.reshape(-1)
    err, ok, squares = 0.0, True, 0.0
    for start in range(0, a.numel(), COMPARE_CHUNK):
        x, y = a[start : start + COMPARE_CHUNK], b[start : start + COMPARE_CHUNK]
        diff = x.to(wide) - y.to(wide)
        err = math.inf if bool(torch.isnan(diff).any()) else max(err, float(diff.abs().max()))
        ok = ok and bool(torch.allclose(x, y, atol=atol, rtol=rtol))
        squares += _l2(diff) ** 2
        del diff
    return err, ok, math.sqrt(squares)


def degenerate_output(new: Any, ref: Any, diff: Any = None, diff_norm: float | None = None) -> str | None:
    """Why the floating tensor ``new`` is a degenerate stand-in for ``ref`` (same shape; ``diff`` =
    ``new - ref``, or its L2 norm ``diff_norm``, when the caller has it), or None. The rule and its numbers:
    the comment above."""
    import torch

    finite = torch.isfinite(ref)
    if not bool(finite.all()):
        new, ref = new[finite], ref[finite]
        diff = diff_norm = None
    del finite
    if ref.numel() == 0:
        return None
    r_min, r_max = (float(v) for v in torch.aminmax(ref))
    scale = max(abs(r_min), abs(r_max))
    if scale <= DEGENERATE_FLOOR:
        return None
    if new.numel() > 1:
        n_min, n_max = (float(v) for v in torch.aminmax(new))
        varies = max(REF_VARIES, 4 * torch.finfo(ref.dtype).eps) * scale
        if n_min == n_max and r_max - r_min > varies:
            return f"is constant (all {n_min:.4g}) while the reference's varies ({r_min:.4g} to {r_max:.4g})"
    wide = torch.promote_types(ref.dtype, torch.float32)
    ref_norm = _l2(ref.to(wide))
    ratio = _l2(new.to(wide)) / ref_norm
    if ratio < MIN_NORM_RATIO:
        return f"norm is {ratio:.3g} of the reference's"
    if diff_norm is None:
        diff_norm = _l2(new.to(wide) - ref.to(wide) if diff is None else diff)
    rel = diff_norm / ref_norm
    if rel > MAX_REL_L2:
        return f"relative L2 error is {rel:.3g} (over {MAX_REL_L2:g})"
    return None


def _l2(x: Any) -> float:
    """The L2 norm of ``x`` as a Python float; in float64 when float32 overflows (values over ~1e19)."""
    import torch

    norm = float(torch.linalg.vector_norm(x))
    if not math.isfinite(norm):
        norm = float(torch.linalg.vector_norm(x, dtype=torch.float64))
    return norm
