"""Degenerate outputs (dice.validator.gpu.compare_outputs): a constant, all-zero or far too small output must
not pass where allclose at 1e-2 would let it (a known KernelBench hole), and honest outputs must still pass.

The CPU tests use synthetic outputs; the GPU tests (marker ``gpu``) run every KernelBench level-1 reference
and one end-to-end candidate whose custom kernel writes zeros for the softmax problem.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dice.validator.gpu import DEGENERATE_FLOOR, MAX_REL_L2, REF_VARIES, compare_outputs, degenerate_output

from .conftest import candidate

ATOL = RTOL = 1e-2


def softmax_like(rows: int = 8, cols: int = 16384, seed: int = 0) -> torch.Tensor:
    """KernelBench's softmax over 16k columns: every value under 1e-2 (the largest ~3e-3)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, cols, generator=g), dim=1)


def check(new: object, ref: object):
    return compare_outputs(new, ref, atol=ATOL, rtol=RTOL)


def test_zeros_and_a_constant_pass_allclose_on_a_softmax_but_fail_here() -> None:
    ref = softmax_like()
    assert float(ref.max()) < ATOL  # why the hole exists
    zeros = torch.zeros_like(ref)
    mean = torch.full_like(ref, float(ref.mean()))
    for degenerate in (zeros, mean):
        assert torch.allclose(degenerate, ref, atol=ATOL, rtol=RTOL)  # plain KernelBench would accept it
        cmp = check(degenerate, ref)
        assert not cmp.correct
        assert "only because the values are small" in cmp.message
    assert check(zeros, ref).message.startswith("output is constant (all 0) while the reference's varies")
    assert "output is constant (all 6.104e-05)" in check(mean, ref).message
    assert check(zeros, ref).max_abs_err == pytest.approx(float(ref.max()))  # still reported as before


def test_scaled_down_and_unrelated_outputs_fail_with_the_reason() -> None:
    ref = softmax_like()
    cmp = check(ref * 0.003, ref)
    assert not cmp.correct and cmp.message.startswith("output norm is 0.003 of the reference's")
    other = softmax_like(seed=1)  # right magnitude, wrong values
    cmp = check(other, ref)
    assert not cmp.correct and "relative L2 error is" in cmp.message and f"over {MAX_REL_L2:g}" in cmp.message


def test_honest_noise_and_reduced_precision_pass() -> None:
    ref = softmax_like()
    g = torch.Generator().manual_seed(3)
    noisy = ref * (1 + 1e-3 * torch.randn(ref.shape, generator=g))  # TF32-like relative noise
    assert check(noisy, ref).correct, check(noisy, ref).message
    for half in (torch.bfloat16, torch.float16):
        rounded = ref.to(half).float()
        cmp = check(rounded, ref)
        assert cmp.correct, (half, cmp.message)
    # a reference and candidate both in bf16 (the dtype must match)
    ref16 = ref.to(torch.bfloat16)
    assert check((ref * (1 + 2e-3)).to(torch.bfloat16), ref16).correct
    # values of magnitude ~1 (relu of a randn): allclose decides, exactly as before
    big = torch.relu(torch.randn(64, 256, generator=g))
    assert check(big + 5e-3, big).correct
    assert check(big.half().float(), big).correct


def test_variation_bf16_could_erase_is_not_required() -> None:
    # a max over 4096 values in [0, 1): 0.998..1 everywhere; rounded through bf16 it may honestly come out
    # as one value, so a constant is left to allclose there (REF_VARIES = 2%)
    g = torch.Generator().manual_seed(5)
    ref = 0.998 + 0.002 * torch.rand(4096, generator=g)
    assert check(ref.to(torch.bfloat16).float(), ref).correct
    assert check(torch.ones_like(ref), ref).correct
    # small values that vary by 6% (KernelBench level 2 problem 58): a constant is rejected
    small = -0.1724 + 0.0099 * torch.rand(4096, generator=g)
    cmp = check(torch.full_like(small, float(small.mean())), small)
    assert not cmp.correct and "is constant" in cmp.message
    assert check(small.to(torch.bfloat16).float(), small).correct


def test_a_legitimately_constant_reference_accepts_an_equal_constant() -> None:
    ones = torch.softmax(torch.randn(16, 1), dim=1)  # a softmax over one column: all 1
    assert check(torch.ones(16, 1), ones).correct
    tiny = torch.full((128,), 1e-3)  # constant and small
    assert check(tiny.clone(), tiny).correct
    assert not check(torch.zeros(128), tiny).correct  # zeros are still not it: norm ratio 0
    zero = torch.zeros(4, 4)  # an all-zero reference: allclose decides
    assert check(torch.zeros(4, 4), zero).correct
    assert check(torch.full((4, 4), 1e-3), zero).correct
    # rounding-level variation of a constant reference (1 ulp) does not make a constant candidate wrong
    wobbly = torch.full((64,), 0.5)
    wobbly[::2] = torch.nextafter(torch.tensor(0.5), torch.tensor(1.0))
    assert check(torch.full((64,), 0.5), wobbly).correct


def test_noise_level_reference_is_left_to_allclose() -> None:
    # a mathematically zero result computed in float32 (rounding noise ~1e-7): an honest kernel's noise
    # differs from the reference's entirely, so only allclose applies
    g = torch.Generator().manual_seed(4)
    ref = 1e-7 * torch.randn(1000, generator=g)
    assert check(torch.zeros(1000), ref).correct
    assert check(1e-7 * torch.randn(1000, generator=g), ref).correct


def test_scalar_outputs() -> None:
    loss = torch.tensor(0.004)  # a small loss: one value is never "constant"
    assert check(torch.tensor(0.00401), loss).correct
    assert not check(torch.tensor(0.0), loss).correct  # norm ratio 0, though inside atol
    assert check(torch.tensor(2.5), torch.tensor(2.5)).correct
    assert check(torch.tensor([0.25]), torch.tensor([0.25])).correct
    assert check(0.004, 0.004).correct  # Python numbers: isclose, as before
    assert check(torch.tensor(0.0), torch.tensor(0.0)).correct


def test_integer_bool_and_infinite_outputs() -> None:
    idx = torch.randint(0, 100, (64,))
    assert check(idx.clone(), idx).correct
    assert not check(torch.zeros_like(idx), idx).correct  # exact compare, as before
    flags = torch.rand(64) > 0.5
    assert check(flags.clone(), flags).correct
    ref = softmax_like(2, 4096)
    ref[0, 0] = float("inf")
    assert check(ref.clone(), ref).correct  # infinities matched by allclose, the rest is checked
    bad = torch.zeros_like(ref)
    bad[0, 0] = float("inf")
    assert not check(bad, ref).correct
    huge = torch.rand(1000) * 1e30  # float32 norms overflow here: computed in float64
    assert check(huge.clone(), huge).correct and not check(huge * 1e-3, huge).correct


def test_several_outputs_are_each_checked() -> None:
    ref = (torch.randn(32), softmax_like(2, 16384))
    cmp = check((ref[0].clone(), torch.zeros_like(ref[1])), ref)
    assert not cmp.correct and cmp.message.startswith("output 1 is constant")


def test_degenerate_output_directly() -> None:
    ref = softmax_like(2, 4096)
    assert degenerate_output(ref.clone(), ref) is None
    assert degenerate_output(torch.zeros_like(ref), ref) is not None
    assert degenerate_output(torch.zeros(0), torch.zeros(0)) is None


@pytest.mark.parametrize("case", ["close", "off", "nan", "inf", "small", "half", "noncontiguous"])
def test_comparison_in_chunks_answers_as_on_whole_tensors(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dice.validator import gpu

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(37, 101, generator=gen)
    new = ref + 1e-4 * torch.randn(37, 101, generator=gen)
    if case == "off":
        new[20, 50] += 0.5
    elif case == "nan":
        new[36, 100] = float("nan")
    elif case == "inf":
        ref[3, 3] = new[3, 3] = float("inf")
    elif case == "small":
        ref, new = ref * 1e-3, torch.zeros_like(ref)
    elif case == "half":
        ref, new = ref.half(), new.half()
    elif case == "noncontiguous":
        ref, new = ref.t(), new.t()
    whole = compare_outputs(new, ref, atol=1e-2, rtol=1e-2)
    monkeypatch.setattr(gpu, "COMPARE_CHUNK", 64)  # 59 chunks and a short last one
    chunked = compare_outputs(new, ref, atol=1e-2, rtol=1e-2)
    assert (chunked.correct, chunked.message) == (whole.correct, whole.message)
    assert chunked.max_abs_err == pytest.approx(whole.max_abs_err)
    assert whole.correct == (case in ("close", "inf", "half", "noncontiguous")), whole.message


# ------------------------------------------------------------------------------------------------ GPU tests
def _level1(shared_data: Path) -> dict[int, str]:
    path = shared_data / "kernelbench" / "problems.jsonl"
    if not path.is_file():
        pytest.skip("../shared/data/kernelbench/problems.jsonl is absent")
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    return {r["problem_id"]: r["code"] for r in rows if r["level"] == 1}


@pytest.fixture(scope="module")
def level1(shared_data: Path) -> dict[int, str]:
    return _level1(shared_data)


def _constant_like(x: torch.Tensor) -> torch.Tensor:
    """The output's mean as a constant: the constant closest to it in L2."""
    finite = x[torch.isfinite(x)] if x.is_floating_point() else x
    value = float(finite.double().mean()) if finite.numel() else 0.0
    return torch.full_like(x, value if x.is_floating_point() else round(value))


def _fakes(x: object) -> list:
    """The degenerate stand-ins to try for one output leaf: zeros where it is not all zero (or rounding
    noise), its mean as well where it varies by more than bf16 rounding could erase (REF_VARIES: e.g. a max
    over 4096 values in [0, 1) is 0.998..1 everywhere, and a kernel rounding through bf16 may honestly give
    one value there), nothing for a constant or zero output (then they may be right)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return []
    finite = (x[torch.isfinite(x)] if x.is_floating_point() else x).double()
    if finite.numel() == 0 or float(finite.abs().max()) <= DEGENERATE_FLOOR:
        return []
    scale = float(finite.abs().max())
    if finite.numel() > 1 and float(finite.max() - finite.min()) > REF_VARIES * scale:
        return [torch.zeros_like, _constant_like]
    return [torch.zeros_like]


def degenerate_stand_ins_passing(module: types.ModuleType, device: torch.device, seed: int = 1234) -> list:
    """Run a KernelBench reference (built and fed as the validator does) and replace each of its output
    leaves by zeros / its mean: the stand-ins compare_outputs calls correct (the GPU test wants none), plus
    "nothing to check" when no leaf has a stand-in. Runs on the CPU too (the dry run uses it)."""
    from dice.validator.gpu import flatten
    from dice.validator.kbsetup import construct_models, generate_inputs

    with torch.no_grad():
        model, _, _ = construct_models(module, types.SimpleNamespace(ModelNew=module.Model), device)
        inputs, _ = generate_inputs(module, device, seed)
        ref = model(*inputs)
        del inputs, model
        leaves = flatten(ref)
        passing, tried = [], 0
        for i, leaf in enumerate(leaves):
            for fake in _fakes(leaf):
                tried += 1
                new = list(leaves)
                new[i] = fake(leaf)
                cand = type(ref)(new) if isinstance(ref, (list, tuple)) else new[0]
                cmp = compare_outputs(cand, ref, atol=ATOL, rtol=RTOL)
                if cmp.correct:
                    passing.append(f"output {i}: {fake.__name__}")
                del new, cand
    return passing if tried else ["nothing to check: the reference's outputs are constant"]


@pytest.mark.gpu
@pytest.mark.parametrize("pid", range(1, 101))
def test_level1_zeros_and_constants_are_not_correct(pid: int, level1: dict[int, str]) -> None:
    """Every KernelBench level-1 reference on its own (seeded) inputs: replacing an output by zeros, or one
    that varies by its mean, is not ``correct``."""
    module = types.ModuleType(f"kb_level1_{pid}")
    exec(compile(level1[pid], f"level1_{pid}.py", "exec"), module.__dict__)
    device = torch.device("cuda", torch.cuda.current_device())
    passing = degenerate_stand_ins_passing(module, device)
    torch.cuda.empty_cache()
    assert passing == [], pid


@pytest.fixture(scope="module")
def gpu_pool() -> Iterator[object]:
    from dice.validator import ValidatorPool

    with ValidatorPool(1, timeout_s=300, cache_verdicts=False) as pool:
        assert pool.gpu
        yield pool


@pytest.mark.gpu
def test_zeros_kernel_for_the_softmax_problem_is_incorrect(gpu_pool, level1: dict[int, str]) -> None:
    """A real custom kernel that writes zeros: before the check, trial 1 passed at 1e-2 (every softmax value
    is under ~4e-6) and only the outputs_cached guard caught it at trial 2; a kernel writing 1e-7 * x got
    through as ``correct``. Both are ``incorrect`` at trial 1 now, saying why."""
    source = candidate("degenerate_zeros_softmax.py")
    zeros = gpu_pool.validate_kernelbench(level1[23], source, timing=False)
    assert zeros.status == "incorrect", zeros.to_json()
    assert "trial 1" in zeros.message and "output is constant (all 0)" in zeros.message
    assert "construction: Model and ModelNew built on the CPU from seed 42" in zeros.log
    assert "inputs: generated on cuda" in zeros.log  # 4096 x 393216 elements: drawn on the GPU
    tiny = gpu_pool.validate_kernelbench(
        level1[23], source.replace("0.0f * x[i]", "1e-7f * x[i]"), timing=False
    )
    assert tiny.status == "incorrect", tiny.to_json()
    assert "trial 1" in tiny.message and "norm is" in tiny.message
