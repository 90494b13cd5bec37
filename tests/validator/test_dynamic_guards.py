"""The dynamic guards of the KernelBench protocol, exercised on the CPU.

``_check_and_time`` normally runs in a GPU worker; here torch's CUDA timing calls are replaced by host-clock
stand-ins and the kernel-launch check by a stub, so the guard logic (mutation, caching, aliasing, fake
tensors, precision, threads, tolerance) is checked in CI with plain PyTorch candidates.
"""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest
import torch
import torch.nn as nn

from dice.validator import kernelbench as kb

from .conftest import RELU_REF


class HostEvent:
    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1e3


@pytest.fixture
def cpu_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (2**40, 2**40))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(L2_cache_size=2**16)
    )


@pytest.fixture
def reference() -> types.ModuleType:
    module = types.ModuleType("relu_ref")
    exec(compile(RELU_REF, "relu_ref.py", "exec"), module.__dict__)
    return module


def check(
    reference: types.ModuleType,
    model_new: nn.Module,
    monkeypatch: pytest.MonkeyPatch,
    *,
    launched: tuple[float, float, set[str]] | None = (1.0, 1.0, {"relu_kernel"}),
    strict: bool = False,
):
    monkeypatch.setattr(kb, "_launched_kernels", lambda *a: launched)
    ctx = types.SimpleNamespace(device_name="cpu stand-in")
    with torch.no_grad():
        return kb._check_and_time(
            ctx, reference, reference.Model(), model_new, torch.device("cpu"), strict, True, ["relu_kernel"]
        )


class Honest(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp_min(x, 0.0)


class Mutates(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        x.mul_(0.5)
        return y


class Caches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            self.cache = torch.relu(x)
        return self.cache


class Aliases(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp_(min=0.0)  # [0, 1) inputs: values unchanged, memory shared


class Meta(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x, device="meta")


class Sub(torch.Tensor):
    pass


class Subclass(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).as_subclass(Sub)


class Half(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).half()


class HalfInside(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).half().float()


class Thread(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()
        return torch.relu(x)


class Wrong(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 1.05


def test_honest_candidate_is_correct_and_timed(cpu_cuda, reference, monkeypatch) -> None:
    v = check(reference, Honest(), monkeypatch)
    assert v.status == "correct", v.message
    assert v.ref_ms > 0 and v.new_ms > 0 and v.speedup == pytest.approx(v.ref_ms / v.new_ms)
    assert "5 trials" in v.message and "reference (eager, live)" in v.log


@pytest.mark.parametrize(
    ("model", "guard"),
    [
        (Mutates, "inputs_mutated"),
        (Caches, "outputs_cached"),
        (Aliases, "output_aliases_input"),
        (Meta, "fake_tensor"),
        (Subclass, "fake_tensor"),
        (Half, "precision_downgrade"),
        (Thread, "side_thread"),
    ],
)
def test_dynamic_guard_rejects(model: type[nn.Module], guard: str, cpu_cuda, reference, monkeypatch) -> None:
    v = check(reference, model(), monkeypatch)
    assert v.status == "rejected" and guard in v.message, v.message


def test_wrong_values_are_incorrect(cpu_cuda, reference, monkeypatch) -> None:
    v = check(reference, Wrong(), monkeypatch)
    assert v.status == "incorrect" and v.correct is False and "trial 1" in v.message


def test_tolerance_default_and_strict(cpu_cuda, reference, monkeypatch) -> None:
    assert check(reference, HalfInside(), monkeypatch).status == "correct"
    v = check(reference, HalfInside(), monkeypatch, strict=True)
    assert v.status == "incorrect" and "atol=0.0001" in v.message


def test_custom_kernel_must_run(cpu_cuda, reference, monkeypatch) -> None:
    v = check(reference, Honest(), monkeypatch, launched=(0.0, 3.0, {"vectorized_elementwise_kernel"}))
    assert v.status == "rejected" and "kernel_never_called" in v.message
    v = check(reference, Honest(), monkeypatch, launched=(0.05, 3.0, {"relu_kernel", "other"}))
    assert v.status == "correct" and "custom_kernels_minor" in v.flags
    v = check(reference, Honest(), monkeypatch, launched=None)
    assert v.status == "correct" and "kernel_launch_not_verified" in v.flags
