"""validate_many: completion order, back-pressure, deadlines, batched prebuilds and the rate figure, on a fake
pool whose futures a few threads resolve after a delay; then once on the real pool without a GPU."""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dice.validator import ValidatorPool, Verdict
from dice.validator.batch import BatchStats, BatchTask, count_builds, gpu_spread, validate_many

from .conftest import RELU_REF, candidate


class FakePool:
    """Like ValidatorPool: ``workers`` threads take tasks from a queue (a cancelled future is skipped). A
    candidate "sleep <s> <status>" finishes after s seconds; one that mentions load_inline builds its
    extension unless a prebuild did."""

    def __init__(self, workers: int = 2, *, prebuild_s: float | None = None) -> None:
        self.workers = workers
        self._queue: queue.Queue[Any] = queue.Queue()
        self.lock = threading.Lock()
        self.submitted: list[str] = []
        self.started: list[str] = []
        self.prebuilt: set[str] = set()
        self.prebuild_calls: list[list[str]] = []
        self.started_before_prebuild: list[int] = []
        self.unfinished = 0
        self.max_unfinished = 0
        self.submit_times: dict[str, float] = {}
        self.prebuild_done: dict[str, float] = {}
        if prebuild_s is not None:
            self.prebuild_s = prebuild_s
            self.submit_prebuild = self._submit_prebuild
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def submit_kernelbench(
        self, ref_src: str, cand_src: str, *, strict: bool = False, timing: bool = True
    ) -> concurrent.futures.Future[Verdict]:
        if "class Model" not in ref_src:
            raise ValueError("not a KernelBench-format reference")
        future: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
        with self.lock:
            self.submitted.append(cand_src)
            self.submit_times[cand_src] = time.monotonic()
            self.unfinished += 1
            self.max_unfinished = max(self.max_unfinished, self.unfinished)
        self._queue.put(("task", cand_src, future))
        return future

    def _submit_prebuild(self, cand_srcs: list[str]) -> concurrent.futures.Future[dict[str, Any]]:
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self.prebuild_calls.append(list(cand_srcs))
        self.started_before_prebuild.append(len(self.started))
        self._queue.put(("prebuild", cand_srcs, future))
        return future

    def _loop(self) -> None:
        while True:
            kind, payload, future = self._queue.get()
            if kind == "stop":
                return
            if not future.set_running_or_notify_cancel():
                with self.lock:
                    self.unfinished -= 1
                continue
            if kind == "prebuild":
                time.sleep(self.prebuild_s)
                with self.lock:
                    self.prebuilt.update(payload)
                    self.prebuild_done.update({c: time.monotonic() for c in payload})
                future.set_result({"built": len(payload)})
                continue
            with self.lock:
                self.started.append(payload)
            _, seconds, status = payload.split()[:3]
            time.sleep(float(seconds))
            log = ""
            if "load_inline" in payload:
                log = f"builds: ext ({'cached' if payload in self.prebuilt else 'built'} 0.1 s)"
            with self.lock:
                self.unfinished -= 1
            future.set_result(Verdict(status, status != "compile_error", message=payload, log=log))

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(("stop", None, None))


@pytest.fixture
def fake() -> Iterator[FakePool]:
    pool = FakePool(2)
    yield pool
    pool.close()


def _task(seconds: float, status: str = "correct", name: str = "", **kw: Any) -> BatchTask:
    return BatchTask(RELU_REF, f"sleep {seconds} {status} {name}".strip(), key=name or seconds, **kw)


def test_verdicts_come_in_completion_order(fake: FakePool) -> None:
    tasks = [_task(0.4, name="slow"), _task(0.05, "incorrect", "fast"), _task(0.2, "compile_error", "mid")]
    got = [(t.key, v.status) for t, v in validate_many(fake, tasks)]
    assert got == [("fast", "incorrect"), ("mid", "compile_error"), ("slow", "correct")]


def test_the_input_is_pulled_lazily_at_most_k_ahead(fake: FakePool) -> None:
    pulled = 0

    def endless() -> Iterator[BatchTask]:
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield _task(0.01 * (i % 3), name=str(i))

    for answered, _ in enumerate(validate_many(fake, endless(), max_in_flight=3), 1):
        assert pulled - answered <= 3  # never more than K taken and unanswered
        if answered == 20:
            break
    assert pulled <= 23
    assert fake.max_unfinished <= 3
    # the default K is twice the pool's width
    pulled = 0
    gen = validate_many(fake, endless())
    next(gen)
    assert pulled <= 2 * fake.workers + 1
    gen.close()


def test_deadlines_while_running_and_while_queued() -> None:
    pool = FakePool(1)
    try:
        tasks = [
            _task(0.6, name="runs-too-long", deadline_s=0.15),
            _task(0.01, name="queued-too-long", deadline_s=0.1),
            _task(0.01, name="in-time", deadline_s=5),
        ]
        got = {t.key: v for t, v in validate_many(pool, tasks, max_in_flight=3)}
        assert got["runs-too-long"].status == "timeout"
        assert "while it was running" in got["runs-too-long"].message
        assert "deadline (0.15 s)" in got["runs-too-long"].message
        assert got["queued-too-long"].status == "timeout"
        assert "while it was queued; it was never started" in got["queued-too-long"].message
        assert got["in-time"].status == "correct"
        time.sleep(0.1)
        assert "sleep 0.01 correct queued-too-long" not in pool.started  # cancelled in the queue
    finally:
        pool.close()


def test_an_abandoned_running_task_still_counts_against_k() -> None:
    pool = FakePool(2)
    try:
        stats = BatchStats()
        tasks = [_task(0.5, name="stuck", deadline_s=0.05)] + [_task(0.05, name=str(i)) for i in range(4)]
        got = [t.key for t, _ in validate_many(pool, tasks, max_in_flight=2, stats=stats)]
        assert got[0] == "stuck" and sorted(got[1:]) == ["0", "1", "2", "3"]
        assert pool.max_unfinished <= 2
        assert stats.abandoned == 1 and stats.deadline_timeouts == 1
    finally:
        pool.close()


def test_groups_are_prebuilt_before_their_tasks_are_submitted() -> None:
    pool = FakePool(3, prebuild_s=0.1)
    try:
        tasks = [_task(0.02, name=f"load_inline {i}") for i in range(7)] + [_task(0.02, name="pure")]
        stats = BatchStats()
        got = list(validate_many(pool, tasks, max_in_flight=6, group_size=3, stats=stats))
        assert len(got) == 8
        assert [len(c) for c in pool.prebuild_calls[:2]] == [3, 3]
        assert pool.started_before_prebuild[:2] == [0, 0]  # K = 2 groups: both prebuilt at once
        assert all(len(c) <= 3 for c in pool.prebuild_calls)
        for src in pool.submitted:
            if src in pool.prebuild_done:
                assert pool.submit_times[src] >= pool.prebuild_done[src]
        cached = [v.log for _, v in got if "cached" in v.log]
        assert stats.builds_cached == len(cached) >= 6
        assert stats.prebuild_calls == len(pool.prebuild_calls)
        assert "prebuilds:" in stats.describe()
    finally:
        pool.close()


def test_prebuild_is_optional_and_a_deadline_can_pass_while_waiting_for_it() -> None:
    pool = FakePool(2, prebuild_s=0.5)
    try:
        tasks = [_task(0.01, name=f"load_inline {i}") for i in range(2)]
        got = list(validate_many(pool, tasks, prebuild=False))
        assert pool.prebuild_calls == [] and all(v.status == "correct" for _, v in got)
        tasks = [_task(0.01, name=f"load_inline x{i}", deadline_s=0.1) for i in range(2)]
        got = list(validate_many(pool, tasks))
        assert len(pool.prebuild_calls) == 1
        assert all("waited for the batched prebuild" in v.message for _, v in got)
    finally:
        pool.close()


def test_budget_ends_the_run_and_drops_what_is_in_flight(fake: FakePool) -> None:
    stats = BatchStats()
    tasks = [_task(0.05, name="quick")] + [_task(2.0, name=f"long{i}") for i in range(5)]
    start = time.monotonic()
    got = [t.key for t, _ in validate_many(fake, tasks, budget_s=0.4, stats=stats)]
    assert time.monotonic() - start < 1.5
    assert got == ["quick"]
    assert stats.dropped == 4  # K = 4: the quick one and three long ones taken, then one more
    assert stats.admitted == 5


def test_a_bad_reference_gets_a_verdict_not_an_exception(fake: FakePool) -> None:
    ((task, verdict),) = list(validate_many(fake, [BatchTask("x = 1\n", "sleep 0 correct", key="bad")]))
    assert task.key == "bad" and verdict.status == "runtime_error"
    assert "not a KernelBench problem" in verdict.message


def test_rate_figure_and_build_counts() -> None:
    assert count_builds("builds: a (cached 0.3 s), b (built 41.0 s); build+import 42.0 s\nok") == (1, 1)
    assert count_builds("builds: none") == (0, 0) and count_builds("") == (0, 0)
    stats = BatchStats(window_s=60)
    stats.start(now=0.0)
    for t in range(10, 130, 10):  # one verdict every 10 s for two minutes, then a burst
        stats.record(Verdict("correct", True, True, log="builds: e (built 1.0 s)"), now=float(t))
    for _ in range(6):
        stats.record(Verdict("incorrect", True, False, log="builds: e (cached 0.1 s)"), now=120.0)
    assert stats.per_minute(now=120.0) == pytest.approx(18 / 2)
    assert stats.recent_per_minute(now=120.0) == pytest.approx(6 + 6 + 1)  # 70..120 s, burst: 13 in 60 s
    assert (stats.builds_built, stats.builds_cached) == (12, 6)
    summary = stats.to_json(now=120.0)
    assert summary["statuses"] == {"correct": 12, "incorrect": 6} and summary["finished"] == 18
    assert "18 verdicts in 2.0 min: 9.0/min" in stats.describe(now=120.0)


def test_the_pool_spreads_its_workers_over_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import dice.validator.pool as pool_module

    monkeypatch.setattr(pool_module, "gpu_available", lambda: True)
    monkeypatch.setattr(pool_module, "_gpu_count", lambda: 4)
    with ValidatorPool(6, gpu=True) as pool:  # no task: no worker process starts
        assert gpu_spread(pool) == {"gpu0": 2, "gpu1": 2, "gpu2": 1, "gpu3": 1}
    monkeypatch.setattr(pool_module, "gpu_available", lambda: False)
    with ValidatorPool(2, gpu=False) as pool:
        assert gpu_spread(pool) == {"cpu": 2}


def test_validate_many_on_the_real_pool_without_a_gpu(cpu_pool: ValidatorPool) -> None:
    tasks = [
        BatchTask(RELU_REF, candidate("level1_19_relu.py"), key="relu"),
        BatchTask(RELU_REF, candidate("adv_pure_torch.py"), key="pure", deadline_s=120),
        BatchTask(RELU_REF, "class ModelNew(:\n", key="syntax"),
        BatchTask("print('no model')\n", candidate("level1_19_relu.py"), key="bad-ref"),
    ]
    stats = BatchStats()
    got = {t.key: v for t, v in validate_many(cpu_pool, tasks, stats=stats)}
    assert got["relu"].status == "compiled" and "NVRTC" in got["relu"].message
    assert got["pure"].status == "rejected" and "no_custom_kernel" in got["pure"].message
    assert got["syntax"].status == "compile_error"
    assert got["bad-ref"].status == "runtime_error"
    assert stats.finished == 4 and stats.per_minute() > 0


def test_agreement_benchmark_finds_the_judged_kernels() -> None:
    """benchmarks/validator_agreement.py on ../shared/data (skipped where it is absent): the PR-67 answers
    joined to their judgements, the references cut from the prompts, the CUDA-L1 kernels with speedups."""
    import importlib.util
    from pathlib import Path

    from dice.validator.reference import check_reference

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "validator_agreement", root / "benchmarks/validator_agreement.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = bench.default_data()
    if not (data / "kernelbench-pr67-dsr1").is_dir() or not (data / "cuda-l1").is_dir():
        pytest.skip(f"no shared data at {data}")
    pytest.importorskip("pyarrow")
    pr67, counts = bench.load_pr67(data / "kernelbench-pr67-dsr1")
    assert counts["judged_correct"] == 786 and counts["kernels"] == len(pr67) == 722
    assert counts["reference_only_rows"] == 69 and counts["judgements_without_answer"] == 64
    assert counts["join: match"] == 716 and counts.get("join: kernel names differ", 0) == 0
    l1, l1_counts = bench.load_cuda_l1(data / "cuda-l1")
    assert len(l1) == 210 and l1_counts["with_global"] == 82
    assert all(t["recorded_speedup"] > 0 for t in l1)
    by_problem = {(t["level"], t["problem"]): t["ref_src"] for t in l1}
    for task in pr67[::50]:
        check_reference(task["ref_src"])  # v0 reference from the prompt, the same text CUDA-L1 holds
        if (task["level"], task["problem"]) in by_problem:
            assert task["ref_src"].strip() == by_problem[(task["level"], task["problem"])].strip()
