"""The ``.cu`` dice-spec path checks correctness on two independently seeded input sets (dice.validator.cu):
the seeding on the CPU, the comparison loop on the CPU (torch's CUDA synchronisation stubbed), and on a GPU a
kernel that is right only for the first seed's inputs (marker ``gpu``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from dice.validator import cu
from dice.validator.cu import SPEC_SEEDS, seed_everything, spec_input_sets
from dice.validator.verdict import Verdict


def _inputs() -> list[Any]:
    """A spec's inputs() drawing from every generator a spec may use."""
    return [torch.rand(64), torch.from_numpy(np.random.rand(8)), random.random(), 64]


def test_two_distinct_seeds() -> None:
    assert len(SPEC_SEEDS) == 2 and len(set(SPEC_SEEDS)) == 2 and SPEC_SEEDS[0] == 0


def test_each_seed_gives_equal_separate_sets_and_the_seeds_differ() -> None:
    sets = [spec_input_sets(_inputs, seed) for seed in SPEC_SEEDS]
    for ref_inputs, new_inputs in sets:
        assert torch.equal(ref_inputs[0], new_inputs[0]) and ref_inputs[0] is not new_inputs[0]
        assert torch.equal(ref_inputs[1], new_inputs[1])  # NumPy is seeded too
        assert ref_inputs[2] == new_inputs[2] and ref_inputs[3] == new_inputs[3]  # and Python's random
        new_inputs[0].add_(1)  # what launch() writes is not what reference() sees
        assert not torch.equal(ref_inputs[0], new_inputs[0])
    (first, _), (second, _) = sets
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
    assert first[2] != second[2]


def test_seed_zero_is_what_a_spec_saw_before() -> None:
    # the first set is the one the single-set protocol used (torch.manual_seed(0)): timings and old
    # verdicts stay comparable
    seed_everything(0)
    values = torch.rand(16)
    torch.manual_seed(0)
    assert torch.equal(values, torch.rand(16))


class _Stage:
    name = ""


def _spec(launch: Any) -> dict[str, Any]:
    return {
        "inputs": lambda: [torch.rand(256), 256],
        "reference": lambda x, n: 2 * x,
        "launch": launch,
    }


@pytest.fixture
def no_cuda_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def test_a_launch_right_for_every_set_passes(no_cuda_sync: None) -> None:
    result = cu._spec_correctness(_spec(lambda module, x, n: x * 2), None, 1e-2, 1e-2, _Stage(), "log")
    assert not isinstance(result, Verdict)
    ref_inputs, new_inputs, worst, line = result
    torch.manual_seed(0)
    assert torch.equal(ref_inputs[0], torch.rand(256))  # the first set is kept for timing
    assert worst == 0.0
    assert line.startswith("correctness: 2 input sets (inputs() after seeds 0, 1) matched at atol=0.01")


def test_a_launch_right_only_for_the_first_seed_is_incorrect(no_cuda_sync: None) -> None:
    torch.manual_seed(0)
    answer = 2 * torch.rand(256)  # hard-coded from seed 0's inputs
    result = cu._spec_correctness(_spec(lambda module, x, n: answer.clone()), None, 1e-2, 1e-2, _Stage(), "")
    assert isinstance(result, Verdict)
    assert result.status == "incorrect" and result.correct is False
    assert result.message.startswith("incorrect (input set 2 of 2, seed 1): ")


def test_inputs_without_randomness_are_noted(no_cuda_sync: None) -> None:
    spec = _spec(lambda module, x, n: x * 2)
    spec["inputs"] = lambda: [torch.arange(256, dtype=torch.float32), 256]
    result = cu._spec_correctness(spec, None, 1e-2, 1e-2, _Stage(), "")
    assert not isinstance(result, Verdict)
    assert "inputs() gave the same values for every seed" in result[3]


def test_a_launch_returning_none_is_a_runtime_error(no_cuda_sync: None) -> None:
    result = cu._spec_correctness(_spec(lambda module, x, n: None), None, 1e-2, 1e-2, _Stage(), "")
    assert isinstance(result, Verdict) and result.status == "runtime_error"


# ------------------------------------------------------------------------------------------------ GPU tests
HARD_CODED = """__constant__ float answer[256] = {TABLE};

// "doubles" x: returns 2 * x for the inputs of seed 0, whatever x is
__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = BODY;
}
/* dice-spec
import numpy as np
import torch

def inputs():
    return [torch.rand(256).cuda()]

def reference(x):
    return 2 * x

def launch(module, x):
    y = torch.empty_like(x)
    module.twice((1,), (256,), (x, y, np.int32(x.numel())))
    return y
*/
"""


def _hard_coded(body: str) -> str:
    torch.manual_seed(0)
    table = ", ".join(f"{v:.9g}f" for v in (2 * torch.rand(256)).tolist())
    return HARD_CODED.replace("TABLE", table).replace("BODY", body)


@pytest.fixture(scope="module")
def seeds_pool() -> Iterator[Any]:
    from dice.validator import ValidatorPool

    with ValidatorPool(1, timeout_s=60, cache_verdicts=False) as pool:
        assert pool.gpu
        yield pool


@pytest.mark.gpu
def test_kernel_right_only_for_the_first_seed_is_incorrect(seeds_pool: Any) -> None:
    honest = seeds_pool.validate_cu(_hard_coded("2.0f * x[i]"))
    assert honest.status == "correct", honest.to_json()
    assert "2 input sets" in honest.message and "correctness: 2 input sets" in honest.log
    v = seeds_pool.validate_cu(_hard_coded("answer[i]"))
    assert v.status == "incorrect", v.to_json()
    assert v.message.startswith("incorrect (input set 2 of 2, seed 1)"), v.message
