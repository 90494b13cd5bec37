"""DICE prompt templates: rendering and token ids against goldens made with DICE's own code.

The golden hashes were produced by running deadlykitten4/DICE @ 1abe887 on KernelBench level 1 problem
19 (ReLU): evaluation/src/prompt_constructor.py through ``AutoTokenizer.apply_chat_template`` of the SDAR
tokenizer, and the training/RL/sample/sdar_rl_rollout_kernel.py strings (the infilling one via jinja2).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from engine.prompts import extract_middle, infill_prompt, kernelbench_prompt, load_template, render
from engine.tokenizer import load_tokenizer

GOLDEN = {
    "eval": (907, "eeab5f3c6d92c139a5a9cb502dbbc79af490ff82f6cb213f32974c170208ef61"),
    "rl": (907, "ee23372405878e09fbcb187f1a6fc7972233898d86912aaa9fe236e232aee38d"),
    "infill": (1325, "e54dddaf0ff55ac3b9e4d1a6185fe0007ad252c84f72bac0fcbdbf9543f44e72"),
}


def digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def add_example_split() -> tuple[str, str, str]:
    """The elementwise-add ModelNew split as DICE's infilling example: prefix | CUDA source | suffix."""
    full = load_template("model_new_ex_add.py.txt")
    a = full.index('elementwise_add_source = """')
    b = full.index("elementwise_add_cpp_source = (")
    return full[:a], full[a:b], full[b:]


@pytest.fixture(scope="module")
def relu_src(shared_data) -> str:
    for line in (shared_data / "kernelbench" / "problems.jsonl").open():
        problem = json.loads(line)
        if problem["level"] == 1 and problem["problem_id"] == 19:
            return problem["code"]
    raise AssertionError("KernelBench level 1 problem 19 not found")


def test_rendered_prompts_give_dice_token_ids(shared_data, relu_src):
    tok = load_tokenizer(shared_data / "sdar-tokenizer")
    prefix, _, suffix = add_example_split()
    prompt, response_prefix = infill_prompt(prefix, suffix, context=relu_src)
    rendered = {
        "eval": kernelbench_prompt(relu_src),
        "rl": kernelbench_prompt(relu_src, variant="rl"),
        "infill": prompt,
    }
    for name, text in rendered.items():
        ids = tok.encode(text)
        assert (len(ids), digest(ids)) == GOLDEN[name], name
    assert rendered["eval"].endswith("NO testing code! \n\n<|im_end|>\n<|im_start|>assistant\n")
    assert response_prefix == "```python\n" + prefix


def test_render_fills_slots_once_and_rejects_missing_values():
    assert render("a {{x}} b {{y}}", x="{{y}}", y="1") == "a {{y}} b 1"
    with pytest.raises(KeyError, match="y"):
        render("{{x}}{{y}}", x="1")
    with pytest.raises(ValueError, match="variant"):
        kernelbench_prompt("x", variant="chat")
    text = kernelbench_prompt("class Model: {{not_a_slot}}")
    assert "class Model: {{not_a_slot}}" in text and text.startswith(
        "<|im_start|>user\nYou write custom CUDA"
    )


def test_extract_middle_stops_at_the_suffix_start():
    prefix, middle, suffix = add_example_split()
    generated = middle + suffix + "```<|im_end|>"
    assert extract_middle(generated, suffix) == (middle, True)
    # Indented suffix: its indentation is not part of the middle.
    assert extract_middle("x = 1\n    return y\n", "    return y\n") == ("x = 1\n", True)
    assert extract_middle("int a;\n```\nmore", "torch::Tensor f();") == ("int a;\n", True)
    assert extract_middle("int a;", "torch::Tensor f();") == ("int a;", False)
    # A closing brace of the kernel is not the closing brace of an inner block.
    body = "    if (i < n) {\n        y[i] = x[i];\n    }\n"
    assert extract_middle(body + "}\n// more", "}\n") == (body, True)
    assert extract_middle(body + "}\n", "\n}\n") == (body[:-1], True)
    # A suffix that continues the hole's line is found mid-line.
    assert extract_middle("a[i] + b[i];\n}", " + b[i];\n}", starts_line=False) == ("a[i]", True)
    # ... but not inside the fill's own brackets: `while (<mask>)` filled with a call, `{ <mask> }` with an
    # initialiser list (seen in CuKe tasks: the reward's reassembly of the original lost its last `)`)
    fill = "__syncthreads_and(state != status)"
    assert extract_middle(fill, ")\n    {\n", starts_line=False) == (fill, False)
    assert extract_middle(fill + ")\n    {\n      f();", ")\n    {\n", starts_line=False) == (fill, True)
    assert extract_middle("(m & (63 << 14)) == (63 << 14)", ")\n", starts_line=False)[0].endswith("14)")
    assert extract_middle("return {0.f, 0.f}; }", " }\n};", starts_line=False) == ("return {0.f, 0.f};", True)
    assert extract_middle('f(")") + 1) {', ") {\n", starts_line=False) == ('f(")") + 1', True)
