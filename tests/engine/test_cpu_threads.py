"""engine.cpu_threads: a small CPU model uses the cores other processes leave idle, read per request."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from engine import load_engine
from engine.cpu_threads import ENV, CpuThreadPolicy, read_proc_stat


class FakeMachine:
    """Clocks the policy reads: wall time, busy CPU seconds of all processes, this process's CPU seconds."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.busy: float | None = 1000.0
        self.own = 5.0
        self.load = 0.0

    def advance(self, seconds: float, *, others: float, own: float) -> None:
        """``seconds`` pass while other processes keep ``others`` cores busy and this one ``own``."""
        self.wall += seconds
        self.own += own * seconds
        if self.busy is not None:
            self.busy += (others + own) * seconds

    def policy(self, cpus: int = 2, cap: int = 2, env: dict | None = None) -> CpuThreadPolicy:
        return CpuThreadPolicy(
            cap=cap,
            cpus=cpus,
            env=env or {},
            busy_reader=lambda: self.busy,
            clock=lambda: self.wall,
            own_clock=lambda: self.own,
            load_average=lambda: self.load,
        )


def test_idle_machine_gets_every_core_up_to_the_cap() -> None:
    m = FakeMachine()
    policy = m.policy(cpus=4, cap=3)
    m.advance(1.0, others=0.1, own=0.0)
    assert policy.choose() == 3
    assert policy.others_busy == pytest.approx(0.1)


def test_a_busy_core_elsewhere_leaves_one_thread_on_two_cores() -> None:
    m = FakeMachine()
    policy = m.policy()
    m.advance(2.0, others=1.0, own=0.0)
    assert policy.choose() == 1
    m.advance(2.0, others=2.0, own=0.0)
    assert policy.choose() == 1  # never below one


def test_own_work_is_not_counted_as_load() -> None:
    """Our previous request kept both cores busy: that is no reason to drop to one thread."""
    m = FakeMachine()
    policy = m.policy()
    m.advance(0.5, others=0.05, own=2.0)
    assert policy.choose() == 2
    assert policy.others_busy == pytest.approx(0.05)


def test_threshold_is_half_a_core() -> None:
    m = FakeMachine()
    policy = m.policy()
    m.advance(1.0, others=0.4, own=0.3)
    assert policy.choose() == 2
    m.advance(1.0, others=0.6, own=0.3)
    assert policy.choose() == 1


def test_readings_close_together_keep_the_last_choice() -> None:
    m = FakeMachine()
    policy = m.policy()
    m.advance(1.0, others=1.5, own=0.0)
    assert policy.choose() == 1
    m.advance(0.01, others=0.0, own=0.0)  # too short to say anything
    assert policy.choose() == 1
    m.advance(1.0, others=0.0, own=0.0)
    assert policy.choose() == 2


def test_without_proc_stat_the_load_average_less_own_work_decides() -> None:
    m = FakeMachine()
    m.busy = None
    policy = m.policy()
    m.load = 1.2
    m.advance(1.0, others=0.0, own=1.0)  # the load average includes this process's own core
    assert policy.choose() == 2
    m.load = 2.0
    m.advance(1.0, others=0.0, own=0.5)
    assert policy.choose() == 1
    m.load = -1.0  # not available at all: assume the machine is busy
    m.advance(1.0, others=0.0, own=0.0)
    assert policy.choose() == 1


def test_environment_fixes_the_count(caplog: pytest.LogCaptureFixture) -> None:
    m = FakeMachine()
    fixed = m.policy(env={ENV: "3"}, cpus=2, cap=1)
    m.advance(1.0, others=2.0, own=0.0)
    assert fixed.choose() == 3  # what the user asked for, even above the core count
    assert m.policy(env={ENV: "auto"}).fixed is None
    with caplog.at_level(logging.WARNING):
        assert m.policy(env={ENV: "many"}).fixed is None
        assert m.policy(env={ENV: "0"}).fixed is None
    assert sum(ENV in r.getMessage() for r in caplog.records) == 2


def test_proc_stat_parsing(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 40 5 5 0 0 0\ncpu0 50 0 25 400 20 2 3 0 0 0\n")
    assert read_proc_stat(str(stat)) == pytest.approx(160 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("garbage\n")
    assert read_proc_stat(str(stat)) is None
    assert read_proc_stat(str(tmp_path / "missing")) is None


def test_engine_runs_with_the_chosen_count_and_restores_torch(tiny_ckpt: Path) -> None:
    engine = load_engine(tiny_ckpt, device="cpu")
    assert engine.cpu_threads is not None  # a small model on CPU
    seen: list[int] = []
    engine.cpu_threads.fixed = 2
    before = torch.get_num_threads()
    engine.generate([1, 2, 3, 4], max_new_tokens=4, on_step=lambda _: seen.append(torch.get_num_threads()))
    assert seen and set(seen) == {2}
    assert torch.get_num_threads() == before
