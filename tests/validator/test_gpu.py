"""GPU tests (device machine): real KernelBench level-1 problems, hand-written candidates, adversarial cases,
and a hanging kernel / an illegal address that must not take down the pool.

Builds are cached by source hash under $DICE_CACHE_DIR; the wrong twins and the adversarial cases share the
extension source of a correct candidate, so the whole file needs 10 extension builds.
``DICE_GPU_TEST_PROBLEMS=19`` limits the KernelBench problems (a quick smoke run: one build).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dice.validator import ValidatorPool, Verdict

from .conftest import CANDIDATES, candidate
from .test_pool import SPEC_FILE

pytestmark = pytest.mark.gpu

PROBLEMS = {
    5: "scale",
    19: "relu",
    21: "sigmoid",
    22: "tanh",
    25: "swish",
    26: "gelu",
    28: "hardsigmoid",
    29: "softplus",
    30: "softsign",
    47: "sum",
}
if os.environ.get("DICE_GPU_TEST_PROBLEMS"):
    _only = {int(x) for x in os.environ["DICE_GPU_TEST_PROBLEMS"].split(",")} | {19}
    PROBLEMS = {pid: stem for pid, stem in PROBLEMS.items() if pid in _only}
ADVERSARIAL = {
    "adv_pure_torch.py": "no_custom_kernel",
    "adv_try_fallback.py": "torch_fallback",
    "adv_never_called.py": "kernel_result_unused",  # static now (forward returns torch.relu(x))
    "adv_side_stream_static.py": "side_stream",
    "adv_side_stream_hidden.py": "dynamic_code",  # static now: getattr(torch, "cu" + "da")
    "adv_side_thread.py": "side_thread",
    "adv_inputs_mutated.py": "inputs_mutated",
    "adv_outputs_cached.py": "outputs_cached",
    "adv_timer_patch.py": "monkey_patch",
    "adv_timer_patch_hidden.py": "dynamic_code",
    "adv_fake_tensor_static.py": "fake_tensor",
    "adv_fake_tensor_meta.py": "fake_tensor",
    "adv_precision_downgrade.py": "precision_downgrade",
    "adv_output_aliases_input.py": "output_aliases_input",
}


@pytest.fixture(scope="module")
def references(shared_data: Path) -> dict[int, str]:
    rows = [json.loads(line) for line in (shared_data / "kernelbench" / "problems.jsonl").open()]
    return {r["problem_id"]: r["code"] for r in rows if r["level"] == 1 and r["problem_id"] in PROBLEMS}


@pytest.fixture(scope="module")
def pool() -> Iterator[ValidatorPool]:
    with ValidatorPool(12, timeout_s=120, cache_verdicts=False) as p:
        assert p.gpu
        yield p


@pytest.fixture(scope="module")
def verdicts(pool: ValidatorPool, references: dict[int, str]) -> dict[str, Verdict]:
    """Every KernelBench case submitted at once (parallel builds), keyed by candidate file."""
    jobs: dict[str, concurrent.futures.Future[Verdict]] = {}
    # the correct candidates first: their 10 distinct builds start at once, the rest reuse them
    for pid, stem in PROBLEMS.items():
        jobs[f"level1_{pid}_{stem}.py"] = pool.submit_kernelbench(
            references[pid], candidate(f"level1_{pid}_{stem}.py")
        )
    for pid, stem in PROBLEMS.items():
        jobs[f"level1_{pid}_{stem}_wrong.py"] = pool.submit_kernelbench(
            references[pid], candidate(f"level1_{pid}_{stem}_wrong.py"), timing=False
        )
    for name in ADVERSARIAL:
        jobs[name] = pool.submit_kernelbench(references[19], candidate(name))
    half = candidate("adv_half_precision_compute.py")
    jobs["half"] = pool.submit_kernelbench(references[19], half, timing=False)
    jobs["half_strict"] = pool.submit_kernelbench(references[19], half, strict=True, timing=False)
    return {name: fut.result(timeout=900) for name, fut in jobs.items()}


def test_all_candidate_files_exist() -> None:
    for pid, stem in PROBLEMS.items():
        assert (CANDIDATES / f"level1_{pid}_{stem}.py").is_file()
        assert (CANDIDATES / f"level1_{pid}_{stem}_wrong.py").is_file()


@pytest.mark.parametrize("pid", sorted(PROBLEMS))
def test_correct_candidate_is_correct_and_timed(pid: int, verdicts: dict[str, Verdict]) -> None:
    v = verdicts[f"level1_{pid}_{PROBLEMS[pid]}.py"]
    assert v.status == "correct", f"{v.status}: {v.message}\n{v.log[-3000:]}"
    assert v.correct is True and v.compiled is True
    assert v.ref_ms is not None and v.ref_ms > 0 and v.new_ms is not None and v.new_ms > 0
    assert v.speedup == pytest.approx(v.ref_ms / v.new_ms)
    assert v.max_abs_err is not None and v.max_abs_err <= 1e-2
    assert "kernels launched" in v.log and "reference (eager, live, host clock)" in v.log


@pytest.mark.parametrize("pid", sorted(PROBLEMS))
def test_wrong_candidate_is_incorrect(pid: int, verdicts: dict[str, Verdict]) -> None:
    v = verdicts[f"level1_{pid}_{PROBLEMS[pid]}_wrong.py"]
    assert v.status == "incorrect", v.to_json()
    assert v.correct is False and v.compiled is True and v.speedup is None


@pytest.mark.parametrize(("name", "guard"), sorted(ADVERSARIAL.items()))
def test_adversarial_candidate_is_rejected(name: str, guard: str, verdicts: dict[str, Verdict]) -> None:
    v = verdicts[name]
    assert v.status == "rejected", v.to_json()
    assert guard in v.message
    assert v.speedup is None


def test_precision_loss_passes_1e2_but_not_strict(verdicts: dict[str, Verdict]) -> None:
    half = verdicts["half"]
    assert half.status == "correct", f"{half.status}: {half.message}\n{half.log[-3000:]}"
    assert verdicts["half_strict"].status == "incorrect"
    assert verdicts["half_strict"].max_abs_err is not None and verdicts["half_strict"].max_abs_err > 1e-4


def test_warm_revalidation_reuses_the_build(
    pool: ValidatorPool, references: dict[int, str], verdicts: dict[str, Verdict]
) -> None:
    start = time.perf_counter()
    v = pool.validate_kernelbench(references[19], candidate("level1_19_relu.py"), timing=False)
    assert v.status == "correct", f"{v.status}: {v.message}\n{v.log[-3000:]}"
    assert "(cached" in v.log
    assert time.perf_counter() - start < 30


# ------------------------------------------------------------------------------------------------ .cu path
HANG = """__global__ void spin(int* flag) {
    while (atomicAdd(flag, 0) == 0) { }
}
/* dice-spec
import torch

def inputs():
    return [torch.zeros(1, dtype=torch.int32, device="cuda")]

def reference(flag):
    return flag + 1

def launch(module, flag):
    module.spin((1,), (1,), (flag,))
    torch.cuda.synchronize()
    return flag
*/
"""

ILLEGAL = """__global__ void scribble(const float* x) {
    float* p = (float*)0x10;
    p[threadIdx.x] = x[0];
}
/* dice-spec
import torch

def inputs():
    return [torch.ones(32, device="cuda")]

def reference(x):
    return x

def launch(module, x):
    module.scribble((1,), (32,), (x,))
    torch.cuda.synchronize()
    return x
*/
"""

INT_DOUBLE = """__global__ void twice(const int* x, int* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2 * x[i];
}
/* dice-spec
import numpy as np
import torch

def inputs():
    return [torch.randint(-1000, 1000, (1 << 16,), dtype=torch.int32, device="cuda")]

def reference(x):
    return x * 2

def launch(module, x):
    y = torch.empty_like(x)
    module.twice(((x.numel() + 255) // 256,), (256,), (x, y, np.int32(x.numel())))
    return y
*/
"""


@pytest.fixture(scope="module")
def small_pool() -> Iterator[ValidatorPool]:
    # 20 s: a fresh worker's first .cu run may wait for its zygote (torch and torch._dynamo imported, ~5 s
    # on the H200) before the kernel's process starts
    with ValidatorPool(1, timeout_s=20, cache_verdicts=False) as p:
        yield p


def test_cu_spec_correct_and_timed(small_pool: ValidatorPool) -> None:
    v = small_pool.validate_cu(SPEC_FILE)
    assert v.status == "correct", f"{v.status}: {v.message}\n{v.log[-3000:]}"
    assert v.speedup is not None and v.ref_ms and v.new_ms
    v = small_pool.validate_cu(INT_DOUBLE)
    assert v.status == "correct" and v.max_abs_err == 0.0, v.to_json()


def test_cu_spec_wrong_kernel_is_incorrect(small_pool: ValidatorPool) -> None:
    v = small_pool.validate_cu(SPEC_FILE.replace("c[i] = a[i] + b[i];", "c[i] = a[i] - b[i];"))
    assert v.status == "incorrect" and v.max_abs_err is not None and v.max_abs_err > 0.01


def test_hanging_kernel_times_out_and_pool_survives(small_pool: ValidatorPool) -> None:
    start = time.perf_counter()
    v = small_pool.validate_cu(HANG)
    assert v.status == "timeout", v.to_json()
    assert time.perf_counter() - start < 60
    assert small_pool.validate_cu(SPEC_FILE).status == "correct"


def test_illegal_address_costs_only_the_kernels_process(small_pool: ValidatorPool) -> None:
    v = small_pool.validate_cu(ILLEGAL)
    assert v.status == "runtime_error", v.to_json()
    assert "illegal" in (v.message + v.log).lower()
    assert small_pool.validate_cu(SPEC_FILE).status == "correct"


SIBLING = """__global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
/* dice-spec
import numpy as np
import torch
from dice_gpu_sibling_ref import reference

def inputs():
    n = 1 << 16
    return [torch.rand(n, device="cuda"), torch.rand(n, device="cuda"), n]

def launch(module, a, b, n):
    c = torch.empty_like(a)
    module.add(((n + 255) // 256,), (256,), (a, b, c, np.int32(n)))
    return c
*/
"""


def test_cu_spec_imports_a_sibling_module_fresh_each_time(small_pool: ValidatorPool, tmp_path: Path) -> None:
    ref = tmp_path / "dice_gpu_sibling_ref.py"
    ref.write_text("def reference(a, b, n):\n    return a + b\n")
    v = small_pool.validate_cu(SIBLING, filename=str(tmp_path / "add.cu"), folder=tmp_path)
    assert v.status == "correct", f"{v.status}: {v.message}\n{v.log[-3000:]}"
    # the same worker (one slot) serves the next task: it must see the new file, not a cached module
    ref.write_text("def reference(a, b, n):\n    return a - b\n")
    v = small_pool.validate_cu(SIBLING, filename=str(tmp_path / "add.cu"), folder=tmp_path)
    assert v.status == "incorrect", v.to_json()
    v = small_pool.validate_cu(SIBLING, filename=str(tmp_path / "add.cu"))
    assert v.status == "runtime_error" and "dice_gpu_sibling_ref" in v.message, v.to_json()
