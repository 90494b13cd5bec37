"""Construction and inputs as KernelBench makes them (dice.validator.kbsetup), on the CPU.

KernelBench seeds before ``get_init_inputs``, ``Model(...)`` and ``ModelNew(...)``, builds both on the CPU and
moves them; a candidate that builds its weights with the legacy ``nn.Parameter(torch.Tensor(out, in))`` and
initialises them as ``nn.Linear`` does must then get exactly the reference's weights.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn as nn

from dice.validator import kbsetup
from dice.validator.kbsetup import construct_models, generate_inputs, input_elements

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(8, 64), torch.randint(0, 10, (8,))]


def get_init_inputs():
    return [64, 32]
"""


class LegacyLinear(nn.Module):
    """What DeepSeek-R1 kernels of KernelBench level 1 problems 60, 65, 77, 79, 86 (and level 2 problem 18)
    do: the legacy constructor, then nn.Linear's own initialisation (weight first, then bias)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(out_features, in_features))
        self.bias = nn.Parameter(torch.Tensor(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_features)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + self.bias


def _module(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def reference() -> types.ModuleType:
    return _module(REFERENCE, "kbsetup_ref")


def test_legacy_constructor_gets_the_references_weights(reference: types.ModuleType) -> None:
    candidate = types.SimpleNamespace(ModelNew=LegacyLinear)
    model, model_new, line = construct_models(reference, candidate, "cpu", 42)
    assert torch.equal(model.linear.weight, model_new.weight)
    assert torch.equal(model.linear.bias, model_new.bias)
    assert model.training and model_new.training  # as KernelBench leaves them (batch statistics)
    assert line == "construction: Model and ModelNew built on the CPU from seed 42"
    # the same seed gives the same weights again; another seed other weights
    again, _, _ = construct_models(reference, candidate, "cpu", 42)
    other, _, _ = construct_models(reference, candidate, "cpu", 7)
    assert torch.equal(again.linear.weight, model.linear.weight)
    assert not torch.equal(other.linear.weight, model.linear.weight)
    x = torch.randn(4, 64)
    assert torch.allclose(model(x), model_new(x), atol=1e-6)


def test_construction_is_on_the_cpu_whatever_default_device_the_candidate_set(
    reference: types.ModuleType,
) -> None:
    # a candidate's import may call torch.set_default_device: construction still happens on the CPU
    # (meta stands in for cuda: the legacy constructor would ignore it, nn.Linear would not)
    candidate = types.SimpleNamespace(ModelNew=LegacyLinear)
    with torch.device("meta"):
        model, model_new, line = construct_models(reference, candidate, "cpu", 42)
    assert model.linear.weight.device.type == "cpu" and model_new.weight.device.type == "cpu"
    assert torch.equal(model.linear.weight, model_new.weight)
    assert "on the CPU" in line


def test_log_line_names_the_target_device(reference: types.ModuleType) -> None:
    candidate = types.SimpleNamespace(ModelNew=LegacyLinear)
    model, model_new, line = construct_models(reference, candidate, torch.device("meta"), 42)
    assert model.linear.weight.is_meta and model_new.weight.is_meta
    assert line == "construction: Model and ModelNew built on the CPU from seed 42, then moved to meta"


def test_init_inputs_are_drawn_on_the_cpu_after_the_seed() -> None:
    source = REFERENCE.replace("return [64, 32]", "return [64, int(torch.randint(1, 1000, (1,)))]")
    seen: list[int] = []

    class Probe(nn.Module):
        def __init__(self, in_features: int, out_features: int) -> None:
            super().__init__()
            seen.append(out_features)

    reference = _module(source.replace("nn.Linear(in_features, out_features)", "nn.Identity()"), "r")
    construct_models(reference, types.SimpleNamespace(ModelNew=Probe), "cpu", 42)
    torch.manual_seed(42)
    assert seen == [int(torch.randint(1, 1000, (1,)))]


def test_inputs_are_the_seeded_cpu_values(reference: types.ModuleType) -> None:
    inputs, where = generate_inputs(reference, "cpu", 1234)
    torch.manual_seed(1234)
    expected = [torch.randn(8, 64), torch.randint(0, 10, (8,))]
    assert all(torch.equal(a, b) for a, b in zip(inputs, expected, strict=True))
    assert inputs[1].dtype == torch.int64  # dtypes are kept
    assert where == "generated on the CPU (seeded)"
    again, _ = generate_inputs(reference, "cpu", 1234)
    other, _ = generate_inputs(reference, "cpu", 99)
    assert torch.equal(again[0], inputs[0]) and not torch.equal(other[0], inputs[0])


def test_small_inputs_are_drawn_on_the_cpu_and_moved(reference: types.ModuleType) -> None:
    # "meta" stands in for the GPU: the values are the CPU's, the tensors end up on the target device
    inputs, where = generate_inputs(reference, "meta", 1234)
    assert where == "generated on the CPU (seeded) and moved to meta"
    assert all(x.is_meta for x in inputs)


def test_large_inputs_are_drawn_on_the_device(reference: types.ModuleType) -> None:
    assert input_elements(reference) == 8 * 64 + 8
    inputs, where = generate_inputs(reference, "meta", 1234, cpu_limit=100)
    assert all(x.is_meta for x in inputs)
    assert where == "generated on meta (520 elements: CPU generation would take long)"
    assert kbsetup.CPU_INPUT_ELEMENTS == 2**26


def test_size_estimate_draws_nothing_and_survives_odd_get_inputs(reference: types.ModuleType) -> None:
    torch.manual_seed(5)
    state = torch.get_rng_state()
    assert input_elements(reference) == 520
    assert torch.equal(torch.get_rng_state(), state)
    # .item() works on the CPU, not under the meta device: size unknown, so drawn on the CPU (the default)
    odd = _module(REFERENCE.replace("torch.randn(8, 64),", "torch.randn(8, 64) * torch.rand(1).item(),"), "o")
    assert input_elements(odd) is None
    inputs, where = generate_inputs(odd, "meta", 1, cpu_limit=100)
    assert all(x.is_meta for x in inputs)
    assert where.startswith("generated on the CPU (seeded) and moved to meta (size unknown")
