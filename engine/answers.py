"""What a model answer means: the one rule that turns an answer into the program it proposes.

``dice generate`` writes, ``dice eval kernelbench`` scores, the training corpus learns from and the RL reward
judges exactly the program :func:`extract_program` returns, so the four can never disagree about it.
"""

from __future__ import annotations

import re

# A fence opens with ``` and an optional language tag on its own line; a block the model did not close
# (it ran out of tokens) runs to the end of the answer.
_FENCE = re.compile(r"```[ \t]*(?P<lang>[\w+-]*)[ \t]*\r?\n(?P<body>.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "py", "python3", "")
_DEFINES_MODEL_NEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)


def code_blocks(answer: str) -> list[tuple[str, str]]:
    """Every fenced block of ``answer`` as (language tag in lower case, body), in order."""
    return [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(answer)]


def extract_program(answer: str) -> str:
    """The python program of a model answer, ending with one newline.

    The first fenced block that defines ``class ModelNew`` (a model may restate the reference ``Model`` in a
    block before its answer); else the first python (or untagged) block; else the whole answer. DICE's
    evaluation takes the first block (``extract_first_code``), which is the same program whenever the answer
    is the single block the model was trained to give.
    """
    blocks = code_blocks(answer)
    chosen = next((body for _lang, body in blocks if _DEFINES_MODEL_NEW.search(body)), None)
    if chosen is None:
        chosen = next((body for lang, body in blocks if lang in _PYTHON_TAGS), None)
    if chosen is None:
        chosen = answer
    return chosen.strip() + "\n"
