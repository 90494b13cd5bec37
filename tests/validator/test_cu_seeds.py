"""The ``.cu`` dice-spec path checks correctness on two independently seeded input sets (dice.validator.cu):
the seeding on the CPU, and on a GPU a kernel that is right only for the first seed's inputs (marker
``gpu``). The comparison loop itself, through the kernel's runner, is in test_cu_judged.py."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from dice.validator.cu import SPEC_SEEDS, seed_everything, spec_inputs


def _inputs() -> list[Any]:
    """A spec's inputs() drawing from every generator a spec may use."""
    return [torch.rand(64), torch.from_numpy(np.random.rand(8)), random.random(), 64]


def test_two_distinct_seeds() -> None:
    assert len(SPEC_SEEDS) == 2 and len(set(SPEC_SEEDS)) == 2 and SPEC_SEEDS[0] == 0


def test_each_seed_gives_the_same_set_and_the_seeds_differ() -> None:
    sets = [spec_inputs(_inputs, seed) for seed in SPEC_SEEDS]
    again = [spec_inputs(_inputs, seed) for seed in SPEC_SEEDS]
    for first, second in zip(sets, again, strict=True):
        assert torch.equal(first[0], second[0]) and first[0] is not second[0]
        assert torch.equal(first[1], second[1])  # NumPy is seeded too
        assert first[2] == second[2] and first[3] == second[3]  # and Python's random
    (first, second) = sets
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
    assert first[2] != second[2]


def test_seed_zero_is_what_a_spec_saw_before() -> None:
    # the first set is the one the single-set protocol used (torch.manual_seed(0)): old verdicts stay
    # comparable
    seed_everything(0)
    values = torch.rand(16)
    torch.manual_seed(0)
    assert torch.equal(values, torch.rand(16))


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
