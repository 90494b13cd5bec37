"""The ``.cu`` spec run with the judge apart from the fill's device code (issue 15, item 1): the module is
compiled and launched in a runner of its own (dice.validator.cu_runner); this process executes the user's
spec for ``inputs()`` and ``reference()``, keeps the reference's outputs, compares and times.

On the CPU the GPU path is emulated (``DICE_VALIDATOR_EMULATE=cpu``): the kernels are stand-ins, Python
functions called as CuPy calls a kernel; judge, zygote, runner, shared buffers, comparison and timing are
the product's own code. Each stand-in plays what device code could do: be right only for the fixed seeds,
remember answers by their inputs, look for the reference's outputs in its process, crash it."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dice.validator import ValidatorPool, cu

from .conftest import EmulatedJudge

STANDINS = """
import gc, os, time
import torch


def twice(grid, block, args):
    x, y, n = args
    y.copy_(2 * x)


def _answer(seed):
    torch.manual_seed(seed)
    return 2 * torch.rand(256)


ANSWERS = [_answer(0), _answer(1)]


def seed0_only(grid, block, args):  # the answer for the inputs of seed 0, whatever x is
    args[1].copy_(ANSWERS[0])


def replay(grid, block, args):  # right for the inputs of both fixed seeds (0, 1), wrong for any other
    x, y, n = args
    for answer in ANSWERS:
        if torch.equal(answer / 2, x):
            y.copy_(answer)
            return
    y.copy_(ANSWERS[0])


MEMO = {}


def remembered(grid, block, args):  # 20 ms the first time it sees an input, a copy afterwards
    x, y, n = args
    key = tuple(x[:8].tolist())
    if key in MEMO:
        y.copy_(MEMO[key])
        return
    time.sleep(0.02)
    y.copy_(2 * x)
    MEMO[key] = y.clone()


def steal(grid, block, args):  # copies the reference's output if it can find it in this process
    x, y, n = args
    for obj in gc.get_objects():
        mine = obj is y or any(obj is a for a in ANSWERS)  # this file's own answers do not count
        if isinstance(obj, torch.Tensor) and not mine and obj.shape == y.shape:
            if torch.allclose(obj, 2 * x):
                y.copy_(obj)
                return
    y.zero_()


def crash(grid, block, args):  # what an illegal address does to a CUDA context: the process is lost
    os.abort()
"""

SOURCE = """__global__ void KERNEL(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""

SPEC = """
import numpy as np
import torch

def inputs():
    return [torch.rand(256)]

def reference(x):
    return 2 * x

def launch(module, x):
    y = torch.empty_like(x)
    module.KERNEL((1,), (256,), (x, y, np.int32(x.numel())))
    return RETURN
"""


@pytest.fixture(scope="module")
def cu_judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedJudge]:
    folder = tmp_path_factory.mktemp("cu-emulated")
    (folder / "standins.py").write_text(STANDINS)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DICE_VALIDATOR_EMULATE", "cpu")
        env.setenv("DICE_EMULATED_EXTENSIONS", str(folder / "standins.py"))
        judge = EmulatedJudge(tmp_path_factory.mktemp("cu-judge"))
        try:
            yield judge
        finally:
            judge.zygote.close()


def run(judge: EmulatedJudge, kernel: str, returned: str = "y") -> tuple[cu.Verdict, bool]:
    spec = SPEC.replace("KERNEL", kernel).replace("RETURN", returned)
    return cu._run_spec(judge, SOURCE.replace("KERNEL", kernel), [kernel], spec, "k.cu", ["NVRTC"], "")


def test_an_honest_kernel_is_correct_and_timed_from_the_judge(cu_judge: EmulatedJudge) -> None:
    verdict, restart = run(cu_judge, "twice")
    assert verdict.status == "correct", verdict.message + verdict.log
    assert not restart and verdict.speedup is not None and verdict.new_ms is not None
    assert "every round's outputs checked" in verdict.message
    assert "kernel's process ready" in verdict.log
    assert f"a fresh input set every round ({cu.CU_WARMUP + cu.CU_TRIALS}, seeds drawn at random)" in (
        verdict.log
    )
    assert "timed from here, go/done" in verdict.log


def test_a_kernel_right_only_for_the_first_seed_is_incorrect(cu_judge: EmulatedJudge) -> None:
    verdict, _ = run(cu_judge, "seed0_only")
    assert verdict.status == "incorrect" and verdict.correct is False
    assert verdict.message.startswith("incorrect (input set 2 of 2, seed 1): "), verdict.message


def test_a_kernel_replaying_both_fixed_seeds_fails_on_the_first_fresh_set(cu_judge: EmulatedJudge) -> None:
    verdict, _ = run(cu_judge, "replay")
    assert verdict.status == "incorrect", verdict.message
    assert verdict.message.startswith("incorrect (timing round 1 of 33, inputs() after seed "), (
        verdict.message
    )


def test_remembering_answers_by_their_inputs_gains_nothing_in_timing(cu_judge: EmulatedJudge) -> None:
    # Rotating a few input sets (as timing did), every timed round after the warm-up would be a copy.
    verdict, _ = run(cu_judge, "remembered")
    assert verdict.status == "correct", verdict.message + verdict.log
    assert verdict.new_ms is not None and verdict.new_ms >= 15.0, verdict.log


def test_the_reference_outputs_are_out_of_the_kernels_reach(cu_judge: EmulatedJudge) -> None:
    verdict, _ = run(cu_judge, "steal")
    assert verdict.status == "incorrect", verdict.message
    assert "input set 1 of 2" in verdict.message


def test_a_crash_costs_the_kernels_process_and_the_next_fill_gets_its_verdict(
    cu_judge: EmulatedJudge,
) -> None:
    verdict, restart = run(cu_judge, "crash")
    assert verdict.status == "runtime_error", verdict.message
    assert "running launch() (seed 0)" in verdict.message and "signal 6" in verdict.message
    assert not restart  # the judge's own context is untouched
    assert run(cu_judge, "twice")[0].status == "correct"


def test_launch_returning_none_and_a_missing_kernel_are_runtime_errors(cu_judge: EmulatedJudge) -> None:
    verdict, _ = run(cu_judge, "twice", returned="None")
    assert verdict.status == "runtime_error"
    assert verdict.message.startswith("launch(module, *inputs) returned None")
    spec = SPEC.replace("KERNEL", "no_such_kernel").replace("RETURN", "y")
    verdict, _ = cu._run_spec(cu_judge, SOURCE, ["no_such_kernel"], spec, "k.cu", [], "")
    assert verdict.status == "runtime_error"
    assert verdict.message.startswith("runtime error while running launch() (seed 0): AttributeError")


def test_a_spec_missing_a_function_is_told_before_any_process_starts(cu_judge: EmulatedJudge) -> None:
    spec = SPEC.replace("def launch(module, x):", "def not_launch(module, x):").replace("RETURN", "y")
    verdict, _ = cu._run_spec(cu_judge, SOURCE, ["twice"], spec, "k.cu", [], "")
    assert verdict.status == "runtime_error" and "missing: launch" in verdict.message


def test_inputs_that_are_not_shared_tensors_travel_by_value(cu_judge: EmulatedJudge) -> None:
    # a NumPy scalar keeps its type (a kernel's int argument), a Python value and a list go as they are
    spec = textwrap.dedent(
        """
        import numpy as np
        import torch

        def inputs():
            return [torch.rand(256), np.int32(256), 2.0, [1, 2]]

        def reference(x, n, k, pair):
            assert isinstance(n, np.int32)
            return k * x

        def launch(module, x, n, k, pair):
            assert isinstance(n, np.int32) and k == 2.0 and pair == [1, 2], (type(n), k, pair)
            y = torch.empty_like(x)
            module.twice((1,), (256,), (x, y, n))
            return y
        """
    )
    verdict, _ = cu._run_spec(cu_judge, SOURCE, ["twice"], spec, "k.cu", [], "")
    assert verdict.status == "correct", verdict.message + verdict.log


SPEC_FILE = (
    SOURCE.replace("KERNEL", "twice")
    + "/* dice-spec"
    + SPEC.replace("KERNEL", "twice").replace("RETURN", "y")
    + "*/\n"
)


def test_a_pool_runs_the_spec_through_the_runner(tmp_path: Path) -> None:
    (tmp_path / "standins.py").write_text(STANDINS)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DICE_VALIDATOR_EMULATE", "cpu")
        env.setenv("DICE_EMULATED_EXTENSIONS", str(tmp_path / "standins.py"))
        env.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
        with ValidatorPool(1, gpu=False, timeout_s=120, cache_verdicts=False) as pool:
            verdict = pool.validate_cu(SPEC_FILE, filename=str(tmp_path / "twice.cu"))
            crashed = pool.validate_cu(
                SPEC_FILE.replace("module.twice(", "module.crash("), filename=str(tmp_path / "c.cu")
            )
            again = pool.validate_cu(SPEC_FILE, filename=str(tmp_path / "twice.cu"))
    assert verdict.status == "correct", verdict.message + verdict.log
    assert "NVRTC" in verdict.log and "kernel's process ready" in verdict.log
    assert crashed.status == "runtime_error" and "signal 6" in crashed.message, crashed.message
    assert again.status == "correct", again.message


def test_inputs_without_randomness_are_noted(cu_judge: EmulatedJudge) -> None:
    spec = SPEC.replace("torch.rand(256)", "torch.arange(256, dtype=torch.float32)")
    spec = spec.replace("KERNEL", "twice").replace("RETURN", "y")
    verdict, _ = cu._run_spec(cu_judge, SOURCE, ["twice"], spec, "k.cu", [], "")
    assert verdict.status == "correct", verdict.message
    assert "inputs() gave the same values for every seed" in verdict.log
