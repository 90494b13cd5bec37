"""engine.answers.extract_program: the one rule that turns a model answer into its program."""

from __future__ import annotations

from engine.answers import extract_program

REFERENCE_BLOCK = "```python\nclass Model(nn.Module):\n    pass\n```\n"
ANSWER_BLOCK = "```python\nimport torch\n\nclass ModelNew(nn.Module):\n    pass\n```\n"


def test_first_block_that_defines_model_new() -> None:
    # a model may restate the reference first: the first fence (DICE's eval) would score the reference
    text = (
        "Here is the reference:\n" + REFERENCE_BLOCK + "and my kernel:\n" + ANSWER_BLOCK + "```bash\nls\n```"
    )
    assert extract_program(text) == "import torch\n\nclass ModelNew(nn.Module):\n    pass\n"


def test_a_single_block_is_what_dice_eval_takes() -> None:
    assert extract_program("intro\n```py\nx = 1\n```\n") == "x = 1\n"
    assert extract_program("```\ny = 2\n```") == "y = 2\n"  # untagged
    assert extract_program("```cpp\nint x;\n```\n```python\nz = 3\n```") == "z = 3\n"


def test_an_unclosed_fence_runs_to_the_end() -> None:
    assert extract_program("```python\nclass ModelNew:\n    x = 1") == "class ModelNew:\n    x = 1\n"


def test_no_fence_is_the_whole_answer() -> None:
    assert extract_program("  class ModelNew: pass  ") == "class ModelNew: pass\n"
    assert extract_program("") == "\n"
