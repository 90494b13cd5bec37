"""The dynamic guards of the KernelBench protocol, exercised on the CPU through the judge and a real runner.

The GPU path is emulated (``DICE_VALIDATOR_EMULATE=cpu``): this test process is the judge, each candidate
runs in a runner forked by the zygote, inputs and outputs travel through shared buffers, the timing is the
judge's go/done protocol. Candidates here are plain PyTorch (the static guards are not applied), so the
guard logic -- mutation, caching, aliasing, fake tensors, precision, threads, tolerance -- is what decides.
"""

from __future__ import annotations

import textwrap

import pytest

from dice.validator.batch import BatchStats, gpu_lock_seconds

from .conftest import judged

HEAD = "import threading, time\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"


def model(body: str, extra: str = "") -> str:
    return textwrap.dedent(extra) + HEAD + textwrap.indent(textwrap.dedent(body), "    ")


HONEST = model("def forward(self, x):\n    return torch.clamp_min(x, 0.0)\n")
MUTATES = model("def forward(self, x):\n    y = torch.relu(x)\n    x.mul_(0.5)\n    return y\n")
CACHES = model(
    """
    def __init__(self):
        super().__init__()
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.relu(x)
        return self.cache
    """
)
ALIASES = model("def forward(self, x):\n    return x.clamp_(min=0.0)\n")  # [0, 1) inputs: same memory
META = model("def forward(self, x):\n    return torch.empty_like(x, device='meta')\n")
SUBCLASS = model(
    "def forward(self, x):\n    return torch.relu(x).as_subclass(Sub)\n",
    "import torch\n\n\nclass Sub(torch.Tensor):\n    pass\n\n\n",
)
HALF = model("def forward(self, x):\n    return torch.relu(x).half()\n")
HALF_INSIDE = model("def forward(self, x):\n    return torch.relu(x).half().float()\n")
THREAD = model(
    "def forward(self, x):\n"
    "    threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()\n"
    "    return torch.relu(x)\n"
)
WRONG = model("def forward(self, x):\n    return torch.relu(x) * 1.05\n")


def test_honest_candidate_is_correct_and_timed(judge) -> None:
    v = judged(judge, HONEST)
    assert v.status == "correct", v.message + v.log
    assert v.ref_ms > 0 and v.new_ms > 0 and v.speedup == pytest.approx(v.ref_ms / v.new_ms)
    assert "5 trials" in v.message and "reference (eager, live, host clock)" in v.log
    assert "timed by the judge, go/done" in v.log and "seeds drawn for this run" in v.log

    assert "timing_stopped_early" not in v.flags and "100 trials, L2 flushed" in v.log
    waited, held = gpu_lock_seconds(v.log)
    assert "gpu lock: waited" in v.log and held > 0 and waited >= 0


SLOW = model("def forward(self, x):\n    time.sleep(0.003)\n    return torch.clamp_min(x, 0.0)\n")


def test_a_build_cut_off_ends_timing_after_the_pilot_and_says_so(judge) -> None:
    # a dataset build keeping kernels at 2x asks to stop below 1x: 10 timed rounds, not 100, and the verdict
    # (still correct: every round's outputs were checked) carries the flag and the count in its message
    v = judged(judge, SLOW, stop_below=1.0)
    assert v.status == "correct" and v.speedup is not None and v.speedup < 1.0, v.message
    assert "timing_stopped_early" in v.flags
    assert "timing stopped after 10 of 100 trials (below the 1x cut-off" in v.message
    assert "10 trials, L2 flushed" in v.log
    stats = BatchStats()
    stats.record(v)
    assert stats.timing_stopped_early == 1 and stats.to_json()["timing_stopped_early"] == 1


def test_a_candidate_above_the_cut_off_is_timed_in_full(judge) -> None:
    v = judged(judge, SLOW, stop_below=1e-6)
    assert v.status == "correct" and "timing_stopped_early" not in v.flags, v.message
    assert "100 trials, L2 flushed" in v.log and "stopped" not in v.message


@pytest.mark.parametrize(
    ("source", "guard"),
    [
        (MUTATES, "inputs_mutated"),
        (CACHES, "outputs_cached"),
        (ALIASES, "output_aliases_input"),
        (META, "fake_tensor"),
        (SUBCLASS, "fake_tensor"),
        (HALF, "precision_downgrade"),
        (THREAD, "side_thread"),
    ],
)
def test_dynamic_guard_rejects(source: str, guard: str, judge) -> None:
    v = judged(judge, source)
    assert v.status == "rejected" and guard in v.message, v.message


def test_wrong_values_are_incorrect(judge) -> None:
    v = judged(judge, WRONG)
    assert v.status == "incorrect" and v.correct is False and "trial 1" in v.message


def test_tolerance_default_and_strict(judge) -> None:
    assert judged(judge, HALF_INSIDE).status == "correct"
    v = judged(judge, HALF_INSIDE, strict=True)
    assert v.status == "incorrect" and "atol=0.0001" in v.message


def test_custom_kernel_must_run(judge, emulated_env) -> None:
    standins = emulated_env / "standins.py"
    original = standins.read_text()
    try:
        standins.write_text(original.replace('"ours": 1.0', '"ours": 0.0'))
        v = judged(judge, HONEST)
        assert v.status == "rejected" and "kernel_never_called" in v.message
        standins.write_text(original.replace('"ours": 1.0', '"ours": 0.05'))
        v = judged(judge, HONEST)
        assert v.status == "correct" and "custom_kernels_minor" in v.flags
        standins.write_text(original.replace("def launch_profile", "def _no_profile"))
        v = judged(judge, HONEST)
        assert v.status == "correct" and "kernel_launch_not_verified" in v.flags
    finally:
        standins.write_text(original)
