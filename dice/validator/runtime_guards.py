"""The dynamic honesty guards of the KernelBench protocol: pure functions over what a run observed.

Each guard is a small named function over one observation that returns the reason it fires, or None:

* :class:`Replaced` - the library functions a candidate replaced (``monkey_patch``: after the import, and
  again after the run);
* :class:`Trial` - one correctness trial (``side_thread`` ... ``outputs_cached``, per trial);
* :class:`Launch` - the profiled forward (``kernel_never_called``).

Where each is observed: ``Replaced``, ``Launch`` and the ``Trial`` guards that need the candidate's own
objects (``side_thread``, ``fake_tensor``, ``precision_downgrade``, ``output_aliases_input``) in the
candidate's runner (:mod:`dice.validator.runner`); ``inputs_mutated`` and ``outputs_cached`` by the judge on
its own buffers (:mod:`dice.validator.kernelbench`). Work that escapes the timed stream needs no guard of
its own any more: the judge times from outside, the runner's device-wide synchronisation included, and
reads the outputs back after every round (``outputs_not_ready``, :mod:`dice.validator.judge`).

:data:`RUNTIME_GUARDS` lists them in the order the worker checks them; :func:`first_rejection` runs those for
one observation and turns the first reason into a verdict with :func:`rejected`, the one constructor of
guard verdicts (``rejected by guard <name>: <reason>`` plus ``where``, e.g. `` (trial 2)``). The static
guards over the candidate's source are in :mod:`dice.validator.guards`.

Nothing here needs a GPU: torch CPU tensors stand in for CUDA ones (torch is imported lazily).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dice.validator.verdict import Verdict


def rejected(
    guard: str,
    message: str,
    *,
    where: str = "",
    compiled: bool = True,
    correct: bool | None = None,
    log: str = "",
) -> Verdict:
    """The verdict of a guard that fired: ``rejected by guard <guard>: <message><where>``."""
    return Verdict(
        "rejected", compiled, correct, message=f"rejected by guard {guard}: {message}{where}", log=log
    )


# ------------------------------------------------------------------------------------------ observations
@dataclass
class Replaced:
    """Library functions the candidate replaced (:meth:`Integrity.violations`), and when: ``actor`` is
    "importing the candidate" or "the candidate"."""

    actor: str
    names: list[str]


@dataclass
class Trial:
    """What one correctness trial observed. The inputs were cloned (``saved``) and given to the reference,
    whose in-place changes (``ref_mutated``) were undone before the candidate got the same inputs."""

    inputs: list[Any]  # the forward arguments after both calls
    saved: list[Any]  # clones of the arguments before the calls
    ref_mutated: list[bool]  # which arguments the reference modified in place
    ref_aliases: bool  # whether an output of the reference shares memory with an argument
    ref_out: Any
    new_out: Any
    device_type: str  # the run's device ("cuda" in a worker)
    threads_before: int  # threading.active_count() before the candidate's call
    threads_after: int  # ... and after it (and a device synchronisation)
    previous: tuple[Any, Any] | None = None  # (candidate, reference) outputs of the trial before, cloned


@dataclass
class Launch:
    """The profiled forward: GPU time in the candidate's own kernels, and their names."""

    ours: float
    kernel_names: list[str]


# ------------------------------------------------------------------------------------------------ guards
def monkey_patch(r: Replaced) -> str | None:
    return f"{r.actor} replaced " + ", ".join(r.names[:5]) if r.names else None


def side_thread(t: Trial) -> str | None:
    return "the candidate started a thread" if t.threads_after > t.threads_before else None


def fake_tensor(t: Trial) -> str | None:
    import torch

    for out in tensors(t.new_out):
        if type(out) is not torch.Tensor or out.is_meta or out.device.type != t.device_type:
            kind = type(out).__name__ if type(out) is not torch.Tensor else f"a {out.device.type} tensor"
            return "output is " + kind + " (must be a plain, materialised CUDA torch.Tensor)"
    return None


def precision_downgrade(t: Trial) -> str | None:
    for o, r in zip(tensors(t.new_out), tensors(t.ref_out), strict=False):
        if narrower(o.dtype, r.dtype):
            return f"output is {o.dtype}, the reference's {r.dtype}"
    return None


def output_aliases_input(t: Trial) -> str | None:
    if not t.ref_aliases and any(same_storage(o, x) for o in tensors(t.new_out) for x in tensors(t.inputs)):
        return "the output shares memory with an input, the reference's does not"
    return None


def inputs_mutated(t: Trial) -> str | None:
    import torch

    for i, (x, s, m) in enumerate(zip(t.inputs, t.saved, t.ref_mutated, strict=True)):
        if isinstance(x, torch.Tensor) and not m and not torch.equal(x, s):
            return f"input {i} was modified in place (the reference leaves it intact)"
    return None


# The reference's output must move by more than KernelBench's tolerance before an unchanged candidate output
# counts as cached: an output the inputs barely move (level 2 problem 41: GroupNorm, then the mean over the
# channels, is 0 up to rounding for any input) is unchanged in an honest kernel too.
CACHED_CHANGE_ATOL = CACHED_CHANGE_RTOL = 1e-2


def outputs_cached(t: Trial) -> str | None:
    if t.previous is not None:
        prev_new, prev_ref = t.previous
        if all_equal(t.new_out, prev_new) and not all_close(t.ref_out, prev_ref):
            return "the output did not change when the inputs did (cached across calls)"
    return None


def kernel_never_called(launch: Launch) -> str | None:
    if launch.ours == 0:
        return (
            f"none of the candidate's kernels ({', '.join(launch.kernel_names) or 'none found'}) ran in "
            "forward()"
        )
    return None


@dataclass(frozen=True)
class RuntimeGuard:
    name: str
    observes: type  # the observation the check takes
    check: Callable[[Any], str | None]


RUNTIME_GUARDS: tuple[RuntimeGuard, ...] = (
    RuntimeGuard("monkey_patch", Replaced, monkey_patch),
    RuntimeGuard("side_thread", Trial, side_thread),
    RuntimeGuard("fake_tensor", Trial, fake_tensor),
    RuntimeGuard("precision_downgrade", Trial, precision_downgrade),
    RuntimeGuard("output_aliases_input", Trial, output_aliases_input),
    RuntimeGuard("inputs_mutated", Trial, inputs_mutated),
    RuntimeGuard("outputs_cached", Trial, outputs_cached),
    RuntimeGuard("kernel_never_called", Launch, kernel_never_called),
)


def first_rejection(
    observed: Replaced | Trial | Launch,
    *,
    where: str = "",
    correct: bool | None = None,
    log: str = "",
) -> Verdict | None:
    """The verdict of the first guard in :data:`RUNTIME_GUARDS` that fires on ``observed``, or None."""
    for guard in RUNTIME_GUARDS:
        if isinstance(observed, guard.observes):
            reason = guard.check(observed)
            if reason is not None:
                return rejected(guard.name, reason, where=where, correct=correct, log=log)
    return None


# ------------------------------------------------------------------------------------------------ tensors
def tensors(obj: Any) -> list[Any]:
    """The tensors among the leaves of nested tuples/lists."""
    import torch

    from dice.validator.gpu import flatten

    return [x for x in flatten(obj) if isinstance(x, torch.Tensor)]


def clone(obj: Any) -> Any:
    """A detached copy of the tensors in ``obj`` (nested tuples/lists keep their type; other leaves as is)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone(x) for x in obj)
    return obj


def same_storage(a: Any, b: Any) -> bool:
    try:
        return (
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.untyped_storage().nbytes() > 0
        )
    except Exception:  # noqa: BLE001 - tensors without storage (subclasses) are caught by the type guard
        return False


def narrower(dtype: Any, ref_dtype: Any) -> bool:
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


def all_close(a: Any, b: Any) -> bool:
    """Same structure, and leaves within :data:`CACHED_CHANGE_ATOL` / ``RTOL`` of each other (floating
    tensors; other leaves equal)."""
    return _leaves_match(a, b, close=True)


def all_equal(a: Any, b: Any) -> bool:
    """Same structure, and equal leaves (tensors: same shape, dtype and values)."""
    return _leaves_match(a, b, close=False)


def _leaves_match(a: Any, b: Any, *, close: bool) -> bool:
    import torch

    from dice.validator.gpu import flatten

    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if close and (x.is_floating_point() or x.is_complex()):
                if not torch.allclose(x, y, atol=CACHED_CHANGE_ATOL, rtol=CACHED_CHANGE_RTOL, equal_nan=True):
                    return False
            elif not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True
