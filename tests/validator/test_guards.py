"""Static honesty guards: each adversarial candidate that can be caught without running is caught, with the
guard named; honest candidates (right or wrong) pass; the dynamic-only cases are left to the GPU tests."""

from __future__ import annotations

import pytest

from dice.validator.guards import analyze_candidate, static_guards
from dice.validator.reference import InvalidReference, check_reference
from dice.validator.verdict import speedup_flags

from .conftest import CANDIDATES, RELU_REF, candidate

STATIC = {
    "adv_pure_torch.py": "no_custom_kernel",
    "adv_try_fallback.py": "torch_fallback",
    "adv_side_stream_static.py": "side_stream",
    "adv_side_thread.py": "side_thread",
    "adv_timer_patch.py": "monkey_patch",
    "adv_fake_tensor_static.py": "fake_tensor",
    # written to get past the first static guards; the data-flow and dynamic-code guards see them now
    "adv_never_called.py": "kernel_result_unused",  # forward returns torch.relu(x)
    "adv_side_stream_hidden.py": "dynamic_code",  # getattr(torch, "cu" + "da")
    "adv_timer_patch_hidden.py": "dynamic_code",
}
DYNAMIC_ONLY = [
    "adv_fake_tensor_meta.py",
    "adv_inputs_mutated.py",
    "adv_outputs_cached.py",
    "adv_precision_downgrade.py",
    "adv_half_precision_compute.py",
    "adv_output_aliases_input.py",
]
HONEST = sorted(p.name for p in CANDIDATES.glob("level1_*.py"))


def guards_of(src: str) -> list[str]:
    return [hit.guard for hit in static_guards(src, analyze_candidate(src))]


@pytest.mark.parametrize(("name", "guard"), sorted(STATIC.items()))
def test_static_adversarial_cases_are_caught(name: str, guard: str) -> None:
    assert guards_of(candidate(name))[:1] == [guard]


@pytest.mark.parametrize("name", DYNAMIC_ONLY)
def test_dynamic_cases_pass_the_static_stage(name: str) -> None:
    assert guards_of(candidate(name)) == []


def test_every_adversarial_file_is_covered() -> None:
    assert sorted(p.name for p in CANDIDATES.glob("adv_*.py")) == sorted([*STATIC, *DYNAMIC_ONLY])


@pytest.mark.parametrize("name", HONEST)
def test_honest_candidates_pass(name: str) -> None:
    src = candidate(name)
    info = analyze_candidate(src)
    assert info.has_model_new
    assert guards_of(src) == []
    (ext,) = info.extensions
    assert ext.resolved and "__global__" in ext.cuda_sources[0]


def test_extension_never_called_statically() -> None:
    src = candidate("level1_19_relu.py").replace("return relu_ext.relu_forward(x, x.numel())", "return x")
    assert "kernel_never_called" in guards_of(src)


def test_kernel_defined_but_never_launched() -> None:
    src = candidate("level1_19_relu.py").replace("relu_kernel<<<(unsigned)blocks, threads>>>(", "(void)(")
    assert "kernel_never_called" in guards_of(src)


@pytest.mark.parametrize(
    ("snippet", "guard"),
    [
        ("import concurrent.futures\n", "side_thread"),
        ("setattr(torch.cuda, 'synchronize', lambda: None)\n", "monkey_patch"),
        ("import time\ntime.perf_counter = lambda: 0.0\n", "monkey_patch"),
        ("torch.Tensor.__eq__ = lambda a, b: True\n", "monkey_patch"),
        ("from torch._subclasses import FakeTensorMode\n", "fake_tensor"),
    ],
)
def test_more_static_tricks(snippet: str, guard: str) -> None:
    src = candidate("level1_19_relu.py").replace("class ModelNew", snippet + "\n\nclass ModelNew")
    assert guard in guards_of(src)


def test_cuda_side_stream_in_the_extension() -> None:
    src = candidate("level1_19_relu.py").replace(
        "auto y = torch::empty_like(x);",
        "auto y = torch::empty_like(x);\n    cudaStream_t s; cudaStreamCreate(&s);",
    )
    assert "side_stream" in guards_of(src)


def test_environment_setup_is_not_a_monkey_patch() -> None:
    src = "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\n" + candidate("level1_19_relu.py")
    assert guards_of(src) == []


def test_reference_must_be_a_kernelbench_problem() -> None:
    check_reference(RELU_REF)
    with pytest.raises(InvalidReference, match="syntax error at line 1"):
        check_reference("class Model(:\n")
    with pytest.raises(InvalidReference, match="get_inputs"):
        check_reference("class Model:\n    pass\n\ndef get_init_inputs():\n    return []\n")


def test_speedup_over_10x_is_flagged() -> None:
    assert speedup_flags(12.0)[0] == ["speedup_over_10x"]
    assert speedup_flags(9.9) == ([], "")
    assert speedup_flags(None) == ([], "")


def _guarded_build(try_body: str) -> str:
    """The honest ReLU candidate with its build inside ``try`` (CUDA-L1 writes them so)."""
    src = candidate("level1_19_relu.py")
    start = src.index("relu_ext = load_inline(")
    end = src.index(")\n", src.index("verbose=False", start)) + 2
    build = src[start:end]
    body = try_body.replace("BUILD", build.replace("\n", "\n    ").rstrip())
    return src[:start] + f"try:\n    {body}\nexcept Exception:\n    relu_ext = None\n" + src[end:]


def test_a_try_around_the_build_alone_is_not_a_fallback_path() -> None:
    # if the build failed in the validator the except would leave no kernel to launch, which the dynamic
    # kernel_never_called guard rejects; the static guard only refuses a try around computation
    src = _guarded_build("USE_CUDA = True\n    BUILD")
    assert "torch_fallback" not in guards_of(src), src
    mixed = _guarded_build("BUILD\n    relu_ext.relu_forward(torch.ones(4, device='cuda'), 4)")
    assert "torch_fallback" in guards_of(mixed)
    assert "torch_fallback" in guards_of(candidate("adv_try_fallback.py"))


def test_a_try_around_a_method_that_builds_is_set_up_too() -> None:
    src = candidate("level1_19_relu.py")
    start = src.index("relu_ext = load_inline(")
    end = src.index(")\n", src.index("verbose=False", start)) + 2
    build = src[start:end].replace("relu_ext = ", "return ").replace("\n", "\n    ")
    helper = f"def _load_kernel():\n    {build.rstrip()}\n\n\ntry:\n    relu_ext = _load_kernel()\n"
    src = src[:start] + helper + "except Exception:\n    relu_ext = None\n" + src[end:]
    assert "torch_fallback" not in guards_of(src), src
