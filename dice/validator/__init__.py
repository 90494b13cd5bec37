"""Validation of CUDA candidates: compile (NVRTC/nvcc), check against a reference and time them on the GPU,
in isolated worker processes. See :class:`ValidatorPool` and :class:`Verdict`."""

from dice.validator.pool import ValidatorPool, gpu_available
from dice.validator.reference import InvalidReference
from dice.validator.verdict import STATUSES, Verdict

__all__ = ["STATUSES", "InvalidReference", "ValidatorPool", "Verdict", "gpu_available"]
