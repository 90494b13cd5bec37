"""DICE prompt templates, rendered to ChatML strings (the engine itself only sees token ids).

The texts are data files in ``engine/templates/`` reproduced from deadlykitten4/DICE (see its SOURCE.md); a
checkpoint answers best to the exact template it was trained on, so they are kept byte for byte, including
their odd whitespace. ``{{name}}`` marks a slot; slots are filled in one pass so user text is never
re-interpreted as a slot.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_SLOT = re.compile(r"\{\{(\w+)\}\}")
RESPONSE_CODE_FENCE = "```python\n"


@cache
def load_template(name: str) -> str:
    """The raw text of ``engine/templates/<name>``."""
    return resources.files("engine").joinpath("templates", name).read_text(encoding="utf-8")


def render(template: str, **values: str) -> str:
    """Fill every ``{{slot}}`` of ``template``; a missing value is an error, never an empty string."""

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"template slot {{{{{key}}}}} has no value")
        return values[key]

    return _SLOT.sub(fill, template)


def chat(user: str) -> str:
    """One user turn plus the generation prompt, as the SDAR/Qwen3 chat template renders it."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


CHAT_ROLES = ("system", "user", "assistant")


def chat_messages(messages: list[tuple[str, str]]) -> str:
    """A conversation of (role, content) turns in ChatML, then the generation prompt: what ``chat`` renders
    for one user turn, extended to system and earlier assistant turns (the SDAR/Qwen3 template's layout)."""
    parts = []
    for role, content in messages:
        if role not in CHAT_ROLES:
            raise ValueError(f"unknown chat role {role!r} (use one of {', '.join(CHAT_ROLES)})")
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def kernelbench_prompt(ref_src: str, *, variant: str = "eval") -> str:
    """The KernelBench one-shot prompt (elementwise-add example) for a PyTorch reference ``Model``.

    variant "eval": DICE's evaluation (``prompt_generate_custom_cuda_from_prompt_template`` through the chat
    template), which gives its published numbers. "rl": the string its end-to-end RL rollouts feed the model
    (ChatML written into the text, slightly different whitespace).
    """
    examples = {
        "example_arch_src": load_template("model_ex_add.py.txt"),
        "example_new_arch_src": load_template("model_new_ex_add.py.txt"),
        "ref_arch_src": ref_src,
    }
    if variant == "eval":
        return chat(render(load_template("kernelbench_eval.txt"), **examples))
    if variant == "rl":
        return render(load_template("kernelbench_rl.txt"), **examples)
    raise ValueError(f"unknown kernelbench prompt variant {variant!r} (use 'eval' or 'rl')")


def infill_prompt(prefix: str, suffix: str, context: str | None = None) -> tuple[str, str]:
    """DICE's kernel-infilling prompt (BiC-RL phase 1) and the response prefix to pre-fill.

    ``context`` is the PyTorch reference shown as "the following architecture" (empty when None). The model
    answers with the whole program in a python code block, so the response is pre-filled with the fence and
    the prefix; the caller generates the middle and stops where the suffix starts.
    """
    prompt = render(
        load_template("kernel_infilling_rl.txt"),
        pytorch_code=context if context is not None else "",
        prefix=prefix,
        suffix=suffix,
    )
    return prompt, RESPONSE_CODE_FENCE + prefix


def infill_opening() -> str:
    """The text every ``infill_prompt`` without context starts with: the template up to the file's prefix
    (up to the context, for prompts with one): what ``Engine.prime_prefix_cache`` prefills ahead of time."""
    sentinel = "\x00prefix\x00"
    prompt, _ = infill_prompt(sentinel, "")
    return prompt[: prompt.index(sentinel)]


def suffix_head(suffix: str) -> str:
    """The first non-blank line of ``suffix`` (stripped): seeing it in the output ends the middle."""
    for line in suffix.splitlines():
        if line.strip():
            return line.strip()
    return ""


def closed_find(generated: str, line: str, start: int = 0) -> int:
    """The first place from ``start`` where ``line`` occurs in ``generated`` and the text before it leaves
    no bracket open (-1: none). Mid-line, a suffix often starts with a closer (``while (<mask>)``: the suffix
    ``)``), and the first ``)`` of a fill like ``f(a) > 0`` is the fill's own, not the suffix's."""
    from engine.shape import open_brackets

    at = generated.find(line, start)
    while at >= 0:
        if open_brackets(generated[:at]) == 0:
            return at
        at = generated.find(line, at + 1)
    return -1


def extract_middle(generated: str, suffix: str, *, starts_line: bool = True) -> tuple[str, bool]:
    """The middle of an infilling answer: text before the suffix's first line (or the code fence's end).

    ``starts_line``: ``generated`` begins at a line start (the prefix ended with a newline). When the
    suffix's first non-blank line sits at a line start (it follows a newline in the suffix, or the hole
    starts a line), it only matches at a line start with the same indentation, so a suffix "}" is not
    taken for the closing brace of an inner block; otherwise it is searched anywhere the text before it
    leaves no bracket open, so a suffix ")" is not taken for the fill's own ``)``.
    Returns (middle, found), ``found`` saying the suffix start (or the fence end) was seen.
    """
    lines = suffix.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None:
        line = lines[first].rstrip()
        leading = "\n".join(lines[:first]) + ("\n" if first else "")  # blank lines before it
        anchored = first > 0 or starts_line
        cut = -1
        if anchored:
            starts = ([0] if starts_line else []) + [
                m + 1 for m in range(len(generated)) if generated[m] == "\n"
            ]
            cut = next((p for p in starts if generated.startswith(line, p)), -1)
        else:
            cut = closed_find(generated, line)
        if cut < 0 and not anchored:
            cut = closed_find(generated, line.strip())
            if cut >= 0:
                line_start = generated.rfind("\n", 0, cut) + 1
                # Indentation before the suffix's first line belongs to the suffix, not the middle.
                cut = line_start if not generated[line_start:cut].strip() else cut
        if cut >= 0:
            middle = generated[:cut]
            if leading and middle.endswith(leading):
                middle = middle[: len(middle) - len(leading)]
            return middle, True
    fence = generated.find("```")
    if fence >= 0:
        return generated[:fence], True
    return generated, False
