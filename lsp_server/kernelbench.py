"""When the editor offers "Generate CUDA kernel" for a Python file, and where the result is written."""

from __future__ import annotations

from pathlib import Path

from dice.validator.reference import defines_model_new, is_kernelbench_reference


def is_generation_target(source: str) -> bool:
    """A KernelBench reference (``dice.validator.reference``: the rule generation itself checks) that has
    no ``ModelNew`` yet (a file that already holds a solution is not offered another)."""
    return is_kernelbench_reference(source) and not defines_model_new(source)


def output_path(reference: Path) -> Path:
    """``foo.py`` -> ``foo_dice.py`` (then ``foo_dice_2.py``, ...): never overwrites an existing file."""
    candidate = reference.with_name(f"{reference.stem}_dice.py")
    n = 2
    while candidate.exists():
        candidate = reference.with_name(f"{reference.stem}_dice_{n}.py")
        n += 1
    return candidate
