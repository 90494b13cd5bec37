"""Whether ``forward``'s output depends on what the candidate's own kernels compute (issue 15, item 2).

A candidate can launch its kernel at full size, discard the result and return a torch fallback in ways no
static rule sees (``F.leaky_relu(x) + 0 * y``, a result routed through a branch never taken, ...); the GPU
time share cannot tell either (its kernel did run), and a fixed share would reject honest kernels (a fused
epilogue after a cuDNN convolution spends under 5 % of forward's time in its own kernel). So the judge asks
directly: after timing, one forward on a fresh input set in which every result of the candidate's extension
functions is shifted by noise; if forward's output still matches the reference, the kernels' work is not
used and the verdict is ``rejected`` (``kernel_result_unused``).

The runner side (:class:`Watch`) wraps every function of every module ``load_inline`` returns, at load
time (so references the candidate keeps to them are watched too). Off, a wrapper only calls through. On
(one forward), each floating or complex tensor the function returns, or writes into one of its tensor
arguments, gets ``scale * (0.5 + u)`` added, ``u`` uniform in [0, 1) from a seed the judge sends and
``scale`` the tensor's largest magnitude (at least 1): a positive shift, so sums and means move as much as
single elements, and a different one per element, so softmax and normalisation do not undo it. Integer and
boolean results are left alone (a shifted index would fault the device).

It is a check that can only reject: a forward that fails on the shifted results, or whose output changes,
passes; when nothing was shifted (no extension call returned or wrote a floating tensor: CuPy or Triton
kernels, say) or the reference gives the same output for two input sets (KernelBench has problems whose
output does not depend on the input), it is not applied and the log says so. A runner is the candidate's
process: what it reports here is a claim, so a candidate that rewrites the runner could pass it, never fail
an honest one; the static ``validator_access`` guard refuses the direct routes to the runner's code (the
validator's package, ``sys.modules``, the garbage collector's object lists, stack frames).
"""

from __future__ import annotations

import functools
from typing import Any


class Watch:
    """The runner's watch on extension calls: :meth:`module` wraps a loaded module's functions;
    :meth:`start` / :meth:`stop` bracket the one forward whose results are shifted."""

    def __init__(self) -> None:
        self.generators: dict[Any, Any] = {}
        self.seed: int | None = None
        self.perturbed = 0

    def module(self, module: Any) -> Any:
        """``module`` with each public callable attribute replaced by a watched one (in place); returned."""
        for name in dir(module):
            if name.startswith("_"):
                continue
            try:
                fn = getattr(module, name)
            except AttributeError:
                continue
            if callable(fn) and not isinstance(fn, type) and not getattr(fn, "_dice_watched", False):
                try:
                    setattr(module, name, self._wrap(fn))
                except (AttributeError, TypeError):  # a read-only attribute: left as it is
                    continue
        return module

    def _wrap(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            if self.seed is None:
                return fn(*args, **kwargs)
            return self._shifted_call(fn, args, kwargs)

        watched._dice_watched = True  # type: ignore[attr-defined]
        return watched

    def start(self, seed: int) -> None:
        self.seed, self.perturbed, self.generators = seed, 0, {}

    def stop(self) -> int:
        self.seed = None
        return self.perturbed

    def _shifted_call(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        given = [x for x in (*args, *kwargs.values()) if _shiftable(x)]
        before = [x.clone() for x in given]
        out = fn(*args, **kwargs)
        for x, old in zip(given, before, strict=True):
            if not torch.equal(x, old):  # written by the call: an output argument
                x.add_(self._noise(x))
                self.perturbed += 1
        return self._shift(out)

    def _shift(self, out: Any) -> Any:
        if isinstance(out, (tuple, list)):
            return type(out)(self._shift(x) for x in out)
        if _shiftable(out):
            self.perturbed += 1
            return out + self._noise(out)
        return out

    def _noise(self, x: Any) -> Any:
        import torch

        generator = self.generators.get(x.device)
        if generator is None:
            generator = torch.Generator(device=x.device)
            generator.manual_seed(int(self.seed or 0))
            self.generators[x.device] = generator
        real = x.real if x.is_complex() else x
        scale = max(float(torch.nan_to_num(real.detach().abs().float()).max()) if x.numel() else 0.0, 1.0)
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
        return (scale * (0.5 + noise)).to(real.dtype)


def _shiftable(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and x.numel() > 0


def same_output(a: Any, b: Any) -> bool:
    """Whether two reference outputs (for two input sets) agree to float rounding (1e-6 of the largest
    magnitude): the output does not depend on the input. A looser test would not do: reductions of random
    inputs (a mean, a loss) agree to 1e-2 across sets by the law of large numbers, yet depend on them."""
    import torch

    from dice.validator.runtime_guards import tensors

    left, right = tensors(a), tensors(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not (x.is_floating_point() or x.is_complex()):
            if not torch.equal(x, y):
                return False
            continue
        scale = float(torch.nan_to_num(y.detach().abs().float()).max()) if y.numel() else 0.0
        if not torch.allclose(x, y, rtol=1e-6, atol=1e-6 * max(scale, 1e-30), equal_nan=True):
            return False
    return True
