"""Prompt pieces (what text surrounds a hole) and ranking order: pure functions, no model."""

from __future__ import annotations

import pytest

from dice.assistant import AssistantSettings, rank
from dice.assistant.prompting import Hole, build_infill_request
from dice.cuda_source import parse_document
from dice.validator import Verdict

SPEC_FILE = """\
/* dice-spec
import torch
def inputs():
    return [torch.randn(1024, device="cuda")]
def reference(x):
    return x * 2
*/
__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    /* <MASK:40> */
}
"""


def _hole(text: str, index: int = 0) -> tuple[object, Hole]:
    doc = parse_document(text)
    m = doc.masks[index]
    return doc, Hole(m.index, m.start_byte, m.end_byte, m.budget, m.function_start_byte, m.function_end_byte)


def test_spec_goes_to_context_not_twice_into_the_prompt() -> None:
    doc, hole = _hole(SPEC_FILE)
    req = build_infill_request(doc, hole, default_max_new_tokens=256, budget_chars=None)
    assert "def reference(x):" in req.context and "dice-spec" in req.context
    assert "def reference" not in req.prefix and "dice-spec" not in req.prefix
    assert req.prefix.endswith("threadIdx.x;\n    ") and req.prefix.startswith("\n__global__ void twice(")
    assert req.suffix == "\n}\n"
    assert req.max_new_tokens == 40  # <MASK:40>


def test_budget_never_exceeds_the_default_cap() -> None:
    doc, hole = _hole("__global__ void k(float* y) {\n    /* <MASK:5000> */\n}\n")
    req = build_infill_request(doc, hole, default_max_new_tokens=256, budget_chars=None)
    assert req.max_new_tokens == 256 and req.context is None


def test_long_file_is_trimmed_around_the_enclosing_kernel() -> None:
    line = "__device__ float f{i}(float v) {{ return v * {i}.0f; }}  // héllo\n"
    filler = "".join(line.format(i=i) for i in range(400))
    kernel = (
        "__global__ void target(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    /* <MASK> */\n"
        "    y[i] = y[i] + 1.0f;\n"
        "}\n"
    )
    text = filler + kernel + filler
    doc, hole = _hole(text)
    budget = 3000
    req = build_infill_request(doc, hole, default_max_new_tokens=128, budget_chars=budget)
    # the prefix counts twice: DICE's format repeats it as the start of the answer
    assert 2 * len(req.prefix.encode()) + len(req.suffix.encode()) <= budget
    # the whole kernel is there, and the cuts fall on line boundaries of the rest of the file
    assert "__global__ void target(const float* x, float* y, int n) {\n    int i =" in req.prefix
    assert req.suffix.startswith("\n    y[i] = y[i] + 1.0f;\n}\n__device__ float f0(")
    assert req.prefix.startswith("__device__ float f") and req.suffix.endswith("// héllo\n")
    assert 2 * len(req.prefix.encode()) + len(req.suffix.encode()) > budget - 2 * 80  # at most a line lost
    # a budget smaller than the kernel keeps the text nearest the hole
    tight = build_infill_request(doc, hole, default_max_new_tokens=128, budget_chars=200)
    assert tight.prefix == "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    "
    assert tight.suffix == "\n    y[i] = y[i] + 1.0f;\n"
    assert 2 * len(tight.prefix.encode()) + len(tight.suffix.encode()) <= 200


def _v(status: str, *, speedup: float | None = None) -> Verdict:
    compiled = status not in ("compile_error",)
    correct = {"correct": True, "incorrect": False}.get(status)
    return Verdict(status=status, compiled=compiled, correct=correct, speedup=speedup)


def test_rank_compiled_then_correct_then_faster_then_confidence() -> None:
    verdicts = [
        _v("compile_error"),  # 0: most confident, but does not compile
        _v("compiled"),  # 1: compiled, not run
        _v("correct", speedup=1.5),  # 2
        _v("correct", speedup=3.0),  # 3: fastest correct
        _v("incorrect", speedup=9.0),  # 4: fast but wrong: speed counts for nothing
        _v("rejected", speedup=50.0),  # 5: a guard fired
        _v("correct", speedup=3.0),  # 6: ties 3 on speed, less confident
    ]
    confidences = [0.99, 0.5, 0.6, 0.7, 0.95, 0.9, 0.2]
    order = rank(list(range(7)), verdicts, confidences)
    assert order == [3, 6, 2, 4, 5, 1, 0]


def test_rank_is_stable_and_handles_unvalidated() -> None:
    assert rank(["a", "b", "c"], [None, None, None], [0.5, 0.5, 0.5]) == [0, 1, 2]
    assert rank(["a", "b"], [None, _v("compiled")], [0.9, 0.1]) == [1, 0]


def test_lru_is_bounded_by_count_and_weight() -> None:
    from dice.assistant.caches import LRU as _LRU

    lru: _LRU[str, str] = _LRU(3, max_weight=10, weight=len)
    for key in "abc":
        lru.put(key, "xx")
    lru.get("a")  # a is now the most recently used
    lru.put("d", "xx")
    assert lru.get("b") is None and lru.get("a") == "xx" and len(lru) == 3
    lru.put("e", "x" * 8)  # weight 2 + 2 + 2 + 8 > 10: the least recently used go until it fits
    assert len(lru) == 2 and lru.get("e") == "x" * 8
    lru.put("huge", "x" * 11)  # heavier than the whole cache: not stored, nothing evicted
    assert lru.get("huge") is None and len(lru) == 2


def test_settings_name_every_bad_value() -> None:
    with pytest.raises(ValueError) as info:
        AssistantSettings(policy="greedy", candidates=0, device="tpu", threshold=1.5, validation_level="all")
    message = str(info.value)
    for word in ("policy", "candidates", "device", "validation_level"):
        assert word in message
    AssistantSettings(policy="entropy", threshold=2.0)  # an entropy budget in nats may exceed 1
    with pytest.raises(ValueError, match="threshold"):
        AssistantSettings(policy="dynamic", threshold=1.5)
