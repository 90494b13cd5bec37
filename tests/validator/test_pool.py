"""The pool on a machine without a GPU: compile-only verdicts, line mapping, KernelBench static checks,
isolation (timeouts, crashes, temp dirs) and parallel submission."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dice.validator import InvalidReference, ValidatorPool

from .conftest import RELU_REF, candidate

SPEC_FILE = """__global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

/* dice-spec
import numpy as np
import torch

def inputs():
    n = 1 << 20
    return [torch.rand(n, device="cuda"), torch.rand(n, device="cuda"), n]

def reference(a, b, n):
    return a + b

def launch(module, a, b, n):
    c = torch.empty_like(a)
    module.add(((n + 255) // 256,), (256,), (a, b, c, np.int32(n)))
    return c
*/
"""


def test_compile_only_without_spec(cpu_pool: ValidatorPool) -> None:
    v = cpu_pool.validate_cu("__global__ void k(float* x) { x[threadIdx.x] = 0.f; }\n")
    assert (v.status, v.compiled, v.correct, v.speedup) == ("compiled", True, None, None)
    assert "no dice-spec" in v.message and "NVRTC" in v.message
    assert v.flags == ["not_run"]


def test_spec_without_gpu_says_it_was_not_run(cpu_pool: ValidatorPool) -> None:
    v = cpu_pool.validate_cu(SPEC_FILE)
    assert v.status == "compiled"
    assert "no CUDA GPU" in v.message


def test_compile_only_request_is_respected(cpu_pool: ValidatorPool) -> None:
    v = cpu_pool.validate_cu(SPEC_FILE, run=False)
    assert v.status == "compiled" and "compile-only" in v.message


def test_compile_error_lands_on_the_users_line(cpu_pool: ValidatorPool) -> None:
    text = SPEC_FILE.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + d[i];")
    v = cpu_pool.validate_cu(text, filename="/home/me/add.cu")
    assert (v.status, v.compiled) == ("compile_error", False)
    assert [d["line"] for d in v.diagnostics] == [2]
    assert v.message.startswith("add.cu(3): error")


def test_kernelbench_without_gpu_is_an_honest_compile_check(cpu_pool: ValidatorPool) -> None:
    v = cpu_pool.validate_kernelbench(RELU_REF, candidate("level1_19_relu.py"))
    assert v.status == "compiled" and v.correct is None and v.speedup is None
    assert "not checked" in v.message and "correctness" in v.message and "NVRTC" in v.message


def test_kernelbench_device_code_error(cpu_pool: ValidatorPool) -> None:
    bad = candidate("level1_19_relu.py").replace("float v = x[i];", "float v = x[i] * missing_scale;")
    v = cpu_pool.validate_kernelbench(RELU_REF, bad)
    assert v.status == "compile_error"
    assert "missing_scale" in v.message


def test_kernelbench_syntax_error_and_missing_model_new(cpu_pool: ValidatorPool) -> None:
    v = cpu_pool.validate_kernelbench(RELU_REF, "import torch\n\nclass ModelNew(torch.nn.Module:\n    pass\n")
    assert v.status == "compile_error" and "syntax error at line 3" in v.message
    assert v.diagnostics[0]["line"] == 2
    v = cpu_pool.validate_kernelbench(RELU_REF, "import torch\n\nclass Model(torch.nn.Module):\n    pass\n")
    assert v.status == "compile_error" and "no class ModelNew" in v.message


def test_kernelbench_static_guard_rejects(cpu_pool: ValidatorPool) -> None:
    v = cpu_pool.validate_kernelbench(RELU_REF, candidate("adv_try_fallback.py"))
    assert v.status == "rejected" and "torch_fallback" in v.message


def test_invalid_reference_raises_at_submit(cpu_pool: ValidatorPool) -> None:
    with pytest.raises(InvalidReference):
        cpu_pool.submit_kernelbench("def get_inputs():\n    return []\n", candidate("level1_19_relu.py"))


def test_parallel_submissions_and_verdict_cache(cpu_pool: ValidatorPool) -> None:
    texts = [f"__global__ void k{i}(float* x) {{ x[threadIdx.x] = {i}.f; }}\n" for i in range(6)]
    futures = [cpu_pool.submit_cu(t) for t in texts]
    assert [f.result(timeout=120).status for f in futures] == ["compiled"] * 6
    start = time.perf_counter()
    again = cpu_pool.submit_cu(texts[0])
    assert again.done() and again.result().status == "compiled"
    assert time.perf_counter() - start < 0.05


def test_verdict_cache_keys_on_the_folder_and_can_be_cleared(cpu_pool: ValidatorPool, tmp_path: Path) -> None:
    text = "__global__ void folder_key(float* x) { x[threadIdx.x] = 7.f; }\n"
    cache = cpu_pool._verdicts
    assert cache is not None
    size = len(cache)
    assert cpu_pool.validate_cu(text, folder=tmp_path / "a").status == "compiled"
    assert cpu_pool.validate_cu(text, folder=str(tmp_path / "b")).status == "compiled"
    assert cpu_pool.validate_cu(text).status == "compiled"
    assert len(cache) == size + 3  # one verdict per folder (None: unknown)
    assert cpu_pool.submit_cu(text, folder=tmp_path / "a").done()  # answered from the cache
    cpu_pool.clear_cache()
    assert len(cache) == 0
    # a task submitted before clear_cache may have read the old files: its verdict is not kept
    pending = cpu_pool.submit_cu(text.replace("7.f", "8.f"), folder=tmp_path)
    cpu_pool.clear_cache()
    assert pending.result(timeout=120).status == "compiled"
    assert len(cache) == 0
    assert cpu_pool.validate_cu(text, folder=tmp_path / "a").status == "compiled"
    assert len(cache) == 1


def probe(pool: ValidatorPool, **task) -> object:
    return pool._submit({"kind": "probe", **task}, use_cache=False).result(timeout=120)


def test_hung_worker_is_killed_and_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path))
    with ValidatorPool(1, gpu=False, timeout_s=1.0) as pool:
        first = json.loads(probe(pool, action="ok").message)
        start = time.perf_counter()
        v = probe(pool, action="sleep", phase="run")
        assert v.status == "timeout" and "killed and replaced" in v.message
        assert time.perf_counter() - start < 10
        second = json.loads(probe(pool, action="ok").message)
        assert second["pid"] != first["pid"]
        assert not Path(first["cwd"]).exists()  # the dead worker's temp dir is gone


@pytest.mark.parametrize(("action", "expected"), [("segfault", "SIGSEGV"), ("exit", "exited with code 3")])
def test_crashing_worker_costs_one_task(action: str, expected: str, cpu_pool: ValidatorPool) -> None:
    v = probe(cpu_pool, action=action, phase="run")
    assert v.status == "runtime_error" and expected in v.message
    assert cpu_pool.validate_cu("__global__ void after_crash(int* x) { *x = 1; }\n").status == "compiled"


def test_worker_lives_in_its_own_temp_dir(cpu_pool: ValidatorPool) -> None:
    info = json.loads(probe(cpu_pool, action="write_cwd").message)
    cwd = Path(info["cwd"])
    assert cwd.name.startswith("dice-worker-") and (cwd / "probe.txt").is_file()
    assert info["home"] == info["cwd"] and info["tmp"].startswith(info["cwd"])
    assert Path.cwd() != cwd and not (Path.cwd() / "probe.txt").exists()
    assert os.getpid() != info["pid"]


def test_closed_pool_refuses_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path))
    pool = ValidatorPool(1, gpu=False)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit_cu("__global__ void k() {}\n")


def test_prewarm_starts_workers_before_any_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path))
    with ValidatorPool(2, gpu=False, prewarm=2) as pool:
        deadline = time.monotonic() + 60
        while any(w is None for w in pool._live) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = {w.pid for w in pool._live if w is not None}
        assert len(pids) == 2
        first = json.loads(probe(pool, action="ok").message)
        assert first["pid"] in pids


def test_verdict_cache_follows_the_files_a_spec_imports(cpu_pool: ValidatorPool, tmp_path: Path) -> None:
    """A cached verdict is served again only while the files its dice-spec imports are unchanged: the
    cache key holds their stamps, so no watcher has to notice the change first. (A cache hit is a future
    that is done when submit returns; a real task needs a worker and an NVRTC compile.)"""
    ref = tmp_path / "ref_mod.py"
    ref.write_text("def reference(x):\n    return x\n")
    text = (
        "/* dice-spec\nfrom ref_mod import reference\n\ndef inputs():\n    return []\n\n"
        "def launch(module):\n    return None\n*/\n"
        "__global__ void k(float* y) { y[0] = 1.0f; }\n"
    )
    assert cpu_pool.submit_cu(text, filename="k.cu", folder=tmp_path).result().status == "compiled"
    assert cpu_pool.submit_cu(text, filename="k.cu", folder=tmp_path).done()  # from the cache
    ref.write_text("def reference(x):\n    return 2 * x\n")
    stat = ref.stat()
    os.utime(ref, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new stamp even on coarse clocks
    changed = cpu_pool.submit_cu(text, filename="k.cu", folder=tmp_path)
    assert not changed.done()  # validated again
    assert changed.result().status == "compiled"
    assert cpu_pool.submit_cu(text, filename="k.cu", folder=tmp_path).done()  # and cached again
