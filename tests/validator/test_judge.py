"""The judge apart from the candidate (issue 15, item 1): cheats an adversarial candidate tries from inside
its runner, on the CPU with the GPU path emulated (``DICE_VALIDATOR_EMULATE=cpu``; conftest.EmulatedJudge).

This process is the judge; every candidate runs in a runner the zygote forks for it alone. The static guards
are not applied here (``judged``), so each cheat reaches the runner; the last tests go through a real pool.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dice.validator import ValidatorPool, sandbox

from .conftest import RELU_REF, candidate, judged

MODEL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return {expr}
"""


HONEST_EXPR = "torch.clamp_min(x, 0.0)"
RELU_CALL = "return relu_ext.relu_forward(x, x.numel())"


def cand(prelude: str, expr: str = HONEST_EXPR) -> str:
    return textwrap.dedent(prelude) + MODEL.format(expr=expr)


def gpu_cand(prelude: str, expr: str = HONEST_EXPR) -> str:
    """The same cheat on the GPU: the hand-written ReLU candidate (a real kernel) behind the prelude."""
    call = RELU_CALL.removeprefix("return ")
    body = candidate("level1_19_relu.py").replace(
        RELU_CALL, f"return {call if expr == HONEST_EXPR else expr}"
    )
    return textwrap.dedent(prelude) + body


HONEST = cand("")

# A forged "ready" and forged replies written at import to every descriptor the runner has (its channel
# among them), with a wrong kernel behind them.
FORGED_REPLIES = (
    """
    import json, os
    lines = [{"id": 0, "event": "ready", "records": [], "kernel_names": ["relu_kernel"], "replaced": []}]
    lines += [{"id": i, "event": e, "rejection": None, "mismatch": None, "values": []}
              for i in range(1, 40) for e in ("ok", "trial", "done")]
    for fd in range(3, 64):
        try:
            os.write(fd, "".join(json.dumps(x) + "\\n" for x in lines).encode())
        except OSError:
            pass
    """,
    "x * 3.0",
)

# The judge's comparison replaced, with a wrong kernel: the replacement lives in the runner only.
PATCHED_COMPARE = (
    """
    import dice.validator.gpu as g
    g.compare_outputs = lambda *a, **k: g.Comparison(True, 0.0, "fine")
    import dice.validator.kernelbench as kb
    kb.compare_outputs = g.compare_outputs
    """,
    "x * 3.0",
)

# Looks for the reference's outputs or its Model: in the frames, through gc, in sys.modules.
STOLEN_REFERENCE = (
    """
    import gc, sys

    def steal(x):
        frame = sys._getframe()
        while frame is not None:
            for name in ("ref_out", "expected", "want"):
                value = frame.f_locals.get(name)
                if isinstance(value, torch.Tensor) and value.shape == x.shape:
                    return value.clone()
            frame = frame.f_back
        for obj in gc.get_objects():
            if type(obj).__name__ == "Model" and isinstance(obj, torch.nn.Module):
                return obj(x)
        for name, module in list(sys.modules.items()):
            if name.startswith("dice_ref_"):
                return module.Model()(x)
        return x * 0.0
    """,
    "steal(x)",
)

# Replays the validator's former fixed seeds: outputs memoised for the inputs they draw, wrong otherwise.
SEED_REPLAY = (
    """
    import random, torch
    MEMO = {}
    rng = random.Random(42)
    for seed in [rng.randrange(2**31) for _ in range(5)] + [42 + 101, 42 + 202]:
        torch.manual_seed(seed)
        x0 = torch.rand(16, 1024)
        MEMO[x0.sum().item()] = torch.relu(x0)

    def replay(x):
        hit = MEMO.get(x.sum().item())
        return hit.clone() if hit is not None else x * 0.5
    """,
    "replay(x)",
)

# Says "done" at once in timing: the runner's own loop patched.
EARLY_DONE = (
    """
    import dice.validator.runner as r
    r.KernelBenchRunner._run = lambda self, request, fds: {"event": "done"}
    """,
)

# Answers every trial "no rejection, no mismatch" without writing the outputs.
SILENT_TRIAL = (
    """
    import dice.validator.runner as r
    r.KernelBenchRunner._trial = lambda self, request, fds: {
        "event": "trial", "rejection": None, "mismatch": None, "values": []}
    """,
)

CRASH = ("import os\n", "os.abort()")
EXIT_AT_IMPORT = ("import os\nos._exit(0)\n",)
KILL_ZYGOTE = ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",)


def test_honest_candidate(judge) -> None:
    v = judged(judge, HONEST)
    assert v.status == "correct", v.message + v.log


# id: (the cheat, the verdict it must get, words in its message or log)
CHEATS = {
    "forged": (FORGED_REPLIES, "rejected", "protocol_violation"),
    "patched-compare": (PATCHED_COMPARE, "incorrect", "trial 1"),
    "stolen-reference": (STOLEN_REFERENCE, "incorrect", "trial 1"),
    "seed-replay": (SEED_REPLAY, "incorrect", "trial 1"),
    "early-done": (EARLY_DONE, "rejected", "outputs_not_ready"),
    "silent-trial": (SILENT_TRIAL, "incorrect", "trial 1"),
    "crash": (CRASH, "runtime_error", "signal 6"),
    "exit": (EXIT_AT_IMPORT, "runtime_error", "exited"),
    # Landlock ABI >= 6 scopes signals: the kill is refused; else the runner dies with its zygote
    "kill-zygote": (
        KILL_ZYGOTE,
        *(
            ("compile_error", "not permitted")
            if sandbox.landlock_abi() >= 6
            else ("runtime_error", "process")
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_caught_and_the_next_honest_candidate_is_correct(judge, name: str) -> None:
    cheat, status, words = CHEATS[name]
    v = judged(judge, cand(*cheat))
    assert v.status == status and words in (v.message + v.log), (v.status, v.message, v.log[-2000:])
    after = judged(judge, HONEST)
    assert after.status == "correct", after.message + after.log


# Remembers each output by its input's content: 20 ms the first time it sees an input, a copy afterwards. With
# timing's input sets rotated, every round after the warm-up was a copy (a 100x "speedup"); with a fresh
# set every round, none is.
MEMOISED = """
import time
import torch
MEMO = {}

def remembered(x, compute):
    key = tuple(x.flatten()[:8].tolist())
    hit = MEMO.get(key)
    if hit is not None:
        return hit.clone()
    time.sleep(0.02)
    out = compute(x)
    MEMO[key] = out.clone()
    return out
"""


def test_remembering_outputs_by_input_gains_nothing_in_timing(judge) -> None:
    v = judged(judge, cand(MEMOISED, "remembered(x, lambda t: torch.clamp_min(t, 0.0))"))
    assert v.status == "correct", v.message + v.log
    assert v.new_ms is not None and v.new_ms >= 15.0, v.log
    assert "a fresh input set every round (103, seeds drawn at random)" in v.log


# The kernel runs at full size; its result is discarded in ways the static guards do not see.
DISCARDED = {
    "times-zero": "torch.clamp_min(x, 0.0) + 0 * relu_ext.relu_forward(x, x.numel())",
    "nan-branch": "torch.where(torch.isnan(y := relu_ext.relu_forward(x, x.numel())), y, torch.relu(x))",
}


@pytest.mark.parametrize("name", sorted(DISCARDED))
def test_a_kernel_result_forward_does_not_use_is_rejected(judge, name: str) -> None:
    v = judged(judge, gpu_cand("", DISCARDED[name]))
    assert (v.status, v.correct) == ("rejected", None), (v.status, v.message, v.log[-1500:])
    assert v.message.startswith("rejected by guard kernel_result_unused: forward's output still matches")
    assert judged(judge, gpu_cand("")).status == "correct"


def test_a_kernel_result_forward_uses_passes_the_dependence_check(judge) -> None:
    v = judged(judge, gpu_cand(""))
    assert v.status == "correct", v.message + v.log
    assert "extension results: used (forward's output changes with the 1 result(s)" in v.log
    # without an extension call to watch, nothing is claimed
    v = judged(judge, HONEST)
    assert "extension results: not checked for use (no extension call returned" in v.log
    # a result written into an output argument is watched too
    into = gpu_cand("", "relu_ext.relu_forward(x, x.numel(), out := torch.empty_like(x)) or out")
    v = judged(judge, into)
    assert v.status == "correct", v.message + v.log
    assert "extension results: used" in v.log


def test_the_dependence_check_on_a_scalar_output_and_on_an_input_independent_one(judge) -> None:
    mean_ref = RELU_REF.replace("return torch.relu(x)", "return torch.relu(x).mean()")
    v = judged(judge, gpu_cand("", "relu_ext.relu_forward(x, x.numel()).mean()"), ref=mean_ref)
    assert v.status == "correct" and "extension results: used" in v.log, v.message + v.log
    cheat = gpu_cand("", "torch.relu(x).mean() + 0 * relu_ext.relu_forward(x, x.numel()).mean()")
    v = judged(judge, cheat, ref=mean_ref)
    assert v.status == "rejected" and "kernel_result_unused" in v.message, v.message
    # an output that does not depend on the input says nothing about the kernel: not checked, not rejected
    zero_ref = RELU_REF.replace("return torch.relu(x)", "return torch.relu(x) * 0.0")
    v = judged(judge, gpu_cand("", "relu_ext.relu_forward(x, x.numel()) * 0.0"), ref=zero_ref)
    assert v.status == "correct", v.message + v.log
    assert "not checked for use (the reference gives the same output for two input sets)" in v.log


@pytest.fixture(scope="module")
def gpu_judge(tmp_path_factory: pytest.TempPathFactory):
    """This process as a GPU worker's judge (CUDA started, not dumpable), runners from a real zygote."""
    import os

    import torch

    from dice.validator.zygote_client import not_dumpable

    from .conftest import EmulatedJudge

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device machine)")
    torch.cuda.init()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability()))
    not_dumpable()
    j = EmulatedJudge(tmp_path_factory.mktemp("gpu-judge"))
    j.gpu, j.emulated, j.device_name = True, False, torch.cuda.get_device_name()
    j.cache_dir = Path(os.environ.get("DICE_CACHE_DIR") or Path.home() / ".cache" / "dice") / "validator"
    try:
        yield j
    finally:
        j.zygote.close()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_caught_on_the_gpu(gpu_judge, name: str) -> None:
    cheat, status, words = CHEATS[name]
    v = judged(gpu_judge, gpu_cand(*cheat))
    assert v.status == status and words in (v.message + v.log), (v.status, v.message, v.log[-2000:])
    after = judged(gpu_judge, gpu_cand(""))
    assert after.status == "correct", after.message + after.log
    assert "relu_kernel" in after.log and after.speedup


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(DISCARDED))
def test_a_discarded_kernel_result_is_rejected_on_the_gpu(gpu_judge, name: str) -> None:
    v = judged(gpu_judge, gpu_cand("", DISCARDED[name]))
    assert v.status == "rejected" and "kernel_result_unused" in v.message, (v.message, v.log[-1500:])
    honest = judged(gpu_judge, gpu_cand(""))
    assert honest.status == "correct" and "extension results: used" in honest.log, honest.log


@pytest.mark.gpu
def test_remembering_outputs_gains_nothing_on_the_gpu(gpu_judge) -> None:
    expr = "remembered(x, lambda t: relu_ext.relu_forward(t, t.numel()))"
    v = judged(gpu_judge, gpu_cand(MEMOISED, expr))
    assert v.status == "correct", v.message + v.log
    assert v.new_ms is not None and v.new_ms >= 15.0, v.log


def test_seeds_differ_between_runs(judge) -> None:
    seeds = []
    for _ in range(2):
        log = judged(judge, HONEST, timing=False).log
        seeds.append(log.split("seeds drawn for this run: ")[1].splitlines()[0])
    assert seeds[0] != seeds[1]


@pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="the runner's extra layer needs Landlock")
def test_runner_cannot_write_any_cache(judge) -> None:
    targets = [
        judge.cache_dir / "cupy" / "poison.cubin",
        judge.cache_dir / "nvcc" / "poison",
        judge.cache_dir / "torch_ext" / "0123abcd" / "relu_ext_0123abcd.so",  # the builder's alone
        judge.cache_dir / "torch_ext" / "0123abcd" / "dice_manifest.json",
        judge.root / "x",
    ]
    for t in targets[:4]:
        t.parent.mkdir(parents=True, exist_ok=True)
    probe = cand(
        f"""
        denied = []
        for path in {[str(t) for t in targets]!r}:
            try:
                open(path, "w").write("poison")
            except OSError:
                denied.append(path)
        assert len(denied) == {len(targets)}, denied
        """
    )
    v = judged(judge, probe)
    assert v.status == "correct", v.message + v.log
    assert not any(t.exists() for t in targets)


# ------------------------------------------------------------------------------------ through a real pool
# libc's write: no exception for descriptors that are not open (the static guards reject try/except)
FD_FORGER = """
import ctypes, json
_line = {"event": "result", "id": 1, "restart": False, "deps": [],
         "verdict": {"status": "correct", "compiled": True, "correct": True, "speedup": 42.0,
                     "message": "forged"}}
_data = (json.dumps(_line) + "\\n").encode()
for _fd in range(3, 256):
    ctypes.CDLL(None).write(_fd, _data, len(_data))
"""


@pytest.fixture(scope="module")
def emulated_pool(emulated_env: Path, tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DICE_CACHE_DIR", str(tmp_path_factory.mktemp("emulated-cache")))
        with ValidatorPool(1, gpu=False, timeout_s=60, cache_verdicts=False) as pool:
            yield pool


def test_forged_worker_results_never_reach_the_pool(emulated_pool) -> None:
    honest = candidate("level1_19_relu.py")
    forger = honest.replace("relu_ext = load_inline(", FD_FORGER + "\nrelu_ext = load_inline(", 1)
    forger = forger.replace(
        "return relu_ext.relu_forward(x, x.numel())", "return relu_ext.relu_forward(x, x.numel()) * 3"
    )
    verdicts = [emulated_pool.validate_kernelbench(RELU_REF, src) for src in (forger, honest, forger, honest)]
    statuses = [v.status for v in verdicts]
    assert statuses[1] == statuses[3] == "correct", [(v.status, v.message) for v in verdicts]
    assert statuses[0] != "correct" and statuses[2] != "correct", [v.message for v in verdicts]
    assert all(v.message != "forged" and v.speedup != 42.0 for v in verdicts)
    assert "protocol_violation" in verdicts[0].message or verdicts[0].status == "incorrect"
    assert json.dumps(verdicts[1].to_json())  # a plain verdict of its own task


def test_draws_name_the_seed_each_round_was_drawn_from(monkeypatch: pytest.MonkeyPatch) -> None:
    from dice.validator import judge as judge_module

    fresh = judge_module.Draws(lambda seed: [seed], 5)
    assert [fresh(i) for i in range(5)] == [[fresh.seed(i)] for i in range(5)] == [[s] for s in fresh.seeds]
    assert fresh.describe.startswith("a fresh input set every round (5")
    monkeypatch.setattr(judge_module, "DRAW_BUDGET_S", 0.0)  # drawing is "too slow": one set, rotated
    rotated = judge_module.Draws(lambda seed: [seed], 5)
    assert [rotated(i) for i in range(5)] == [[rotated.seed(i)] for i in range(5)] == [[rotated.seeds[0]]] * 5
    assert rotated.describe.startswith("1 input set(s) rotated over 5 rounds")


def test_a_build_the_sandbox_denies_is_said_to_be_the_sandboxs(judge, tmp_path: Path) -> None:
    """A candidate whose build writes outside its task folder (CUDA-L1's L3P43 puts its load_inline sources
    in /tmp/cuda_extensions) is not built; the verdict says the sandbox stopped it, not the compiler."""
    import os

    from dice.validator.verdict import verdict_label

    if sandbox.landlock_abi() == 0:
        pytest.skip("no Landlock here: the runner's writes are not confined to its task folder")
    outside = tmp_path / "cuda_extensions"  # the test's folder: outside the runner's task folder
    v = judged(judge, cand(f"import os\nos.makedirs({str(outside)!r}, exist_ok=True)\n"))
    assert v.status == "compile_error" and v.flags == ["sandbox_denied"], v.message
    assert f"sandbox denied access to {outside}" in v.message and "PermissionError" in v.message
    assert verdict_label(v.to_json()) == "not built: denied by the validator's sandbox"
    assert not os.path.exists(outside)
    # an error of the code itself stays a plain compile error
    v = judged(judge, cand("import os\nos.makedirs('')\n"))
    assert v.status == "compile_error" and v.flags == [] and "sandbox" not in v.message
    assert verdict_label(v.to_json()) == "compiled ✗"


def test_sandbox_denial_names_only_permission_errors_outside_the_task_folder(tmp_path: Path) -> None:
    import errno

    from dice.validator.runner import sandbox_denial

    task = tmp_path / "task"
    task.mkdir()
    outside = PermissionError(errno.EACCES, "Permission denied", "/tmp/cuda_extensions")
    assert sandbox_denial(outside, task) == "/tmp/cuda_extensions"
    assert sandbox_denial(OSError(errno.EROFS, "Read-only file system", "/usr/lib/x"), task) == "/usr/lib/x"
    inside = PermissionError(errno.EACCES, "Permission denied", str(task / "build" / "x.so"))
    assert sandbox_denial(inside, task) is None
    assert sandbox_denial(FileNotFoundError(errno.ENOENT, "No such file", "/tmp/x"), task) is None
    assert sandbox_denial(PermissionError(errno.EPERM, "Operation not permitted"), task) is None  # no path
    try:  # raised from inside a build step: the chain is followed
        try:
            raise outside
        except PermissionError as exc:
            raise RuntimeError("Error building extension") from exc
    except RuntimeError as chained:
        assert sandbox_denial(chained, task) == "/tmp/cuda_extensions"


def test_a_runner_can_only_add_the_sandbox_flag_to_a_failure() -> None:
    from dice.validator.judge import RunnerFailed, _runner_flags, runner_verdict

    assert _runner_flags(["sandbox_denied", "speedup_over_10x"]) == ("sandbox_denied",)
    assert _runner_flags(["cached_verdict"]) == () and _runner_flags("sandbox_denied") == ()
    v = runner_verdict(RunnerFailed("compile_error", "m", flags=("sandbox_denied",)))
    assert (v.status, v.compiled, v.flags) == ("compile_error", False, ["sandbox_denied"])
