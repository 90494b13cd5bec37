"""Rendering with the engine's templates: the same strings the engine prompts with at inference.

Each function returns (prompt, response): the prompt ends with what the engine pre-fills, the response is
the text the model is trained to produce after it.
"""

from __future__ import annotations

from training.corpus.cuts import CudaString


def render_kernelbench(ref_src: str, program: str) -> tuple[str, str]:
    """DICE whole-program generation: the KernelBench one-shot prompt; the answer is one python block."""
    from engine.prompts import kernelbench_prompt

    return kernelbench_prompt(ref_src), f"```python\n{program.rstrip()}\n```"


def render_cu_infill(prefix: str, middle: str, suffix: str) -> tuple[str, str]:
    """``.cu`` infilling through the engine's infill prompt (no PyTorch context).

    The prompt ends with the response prefix the engine pre-fills (code fence + prefix). The target is the
    middle followed by the suffix up to its first non-blank line: the engine stops once that line appears
    (``engine.prompts.extract_middle``), so the model learns where the hole ends without copying the whole
    suffix.
    """
    from engine.prompts import infill_prompt

    prompt, response_prefix = infill_prompt(prefix, suffix, context=None)
    head_end = _first_line_end(suffix)
    return prompt + response_prefix, middle + suffix[:head_end]


def _first_line_end(text: str) -> int:
    pos = 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if line.strip():
            return pos
    return len(text)


def render_dice_infill(ref_src: str, program: str, cuda: CudaString) -> tuple[str, str]:
    """DICE BiC-RL phase-1 infilling: the PyTorch reference and the program around its CUDA source string are
    shown; the response (after the pre-filled fence + prefix) is the CUDA source, the suffix and the fence."""
    from engine.prompts import infill_prompt

    prefix, middle, suffix = program[: cuda.start], cuda.text, program[cuda.end :]
    prompt, response_prefix = infill_prompt(prefix, suffix, context=ref_src)
    return prompt + response_prefix, f"{middle}{suffix.rstrip()}\n```"
