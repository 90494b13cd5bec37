"""How many intra-op threads a small model's CPU forward gets: the cores that other processes leave idle.

A small model's forward is a few tiny matmuls. A second thread halves its prefill when a core is free, but
when another process holds that core every parallel op waits at its barrier for a thread that is not
running (measured 2.4-12x slower on a loaded 2-core machine). So the count is chosen per request from
what the machine did since the previous one: CPU time all processes used (``/proc/stat``; elsewhere the
1-minute load average) minus this process's own (``time.process_time``), over wall time. The cores left
free, rounded, capped by torch's thread count at start (which honours ``OMP_NUM_THREADS``), at least 1.
``DICE_CPU_THREADS=N`` fixes the count instead.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV = "DICE_CPU_THREADS"
# Two readings closer than this say little about the machine: keep the previous decision.
MIN_INTERVAL_S = 0.05


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # monotonic clock
    busy_s: float | None  # CPU seconds all processes spent busy since boot (None: not readable)
    own_s: float  # CPU seconds this process spent (all its threads)


def read_proc_stat(path: str = "/proc/stat") -> float | None:
    """Busy CPU seconds since boot summed over all cores (user+nice+system+irq+softirq+steal), or None."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    try:
        ticks = [int(x) for x in fields[1:9]]
    except ValueError:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    # guest time is already counted in user; fields past steal are not added
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class CpuThreadPolicy:
    """``choose()`` before each request: the thread count for it (see the module docstring)."""

    def __init__(
        self,
        *,
        cap: int,
        cpus: int | None = None,
        env: Mapping[str, str] | None = None,
        busy_reader: Callable[[], float | None] = read_proc_stat,
        clock: Callable[[], float] = time.monotonic,
        own_clock: Callable[[], float] = time.process_time,
        load_average: Callable[[], float] | None = None,
    ) -> None:
        self.cpus = cpus if cpus is not None else usable_cpus()
        self.cap = max(1, min(cap, self.cpus))
        self._busy_reader = busy_reader
        self._clock = clock
        self._own_clock = own_clock
        self._load_average = load_average if load_average is not None else _load_average_1min
        self.fixed = _fixed_from_env(env if env is not None else os.environ)
        self._last = self._sample()
        self.last_choice = self.fixed or 1
        self.others_busy: float | None = None  # cores other processes kept busy at the last reading

    def _sample(self) -> CpuSample:
        return CpuSample(self._clock(), self._busy_reader(), self._own_clock())

    def choose(self) -> int:
        if self.fixed is not None:
            return self.fixed
        now = self._sample()
        wall = now.wall_s - self._last.wall_s
        if wall < MIN_INTERVAL_S:
            return self.last_choice
        own = max(0.0, now.own_s - self._last.own_s) / wall
        if now.busy_s is not None and self._last.busy_s is not None:
            others = (now.busy_s - self._last.busy_s) / wall - own
        else:  # no /proc/stat (macOS, Windows): the load average, less what this process did
            load = self._load_average()
            others = load - own if load >= 0 else float(self.cpus)  # unknown: assume busy
        self._last = now
        self.others_busy = max(0.0, others)
        free = self.cpus - self.others_busy
        self.last_choice = max(1, min(self.cap, int(free + 0.5)))
        return self.last_choice


def _load_average_1min() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return -1.0


def _fixed_from_env(env: Mapping[str, str]) -> int | None:
    value = env.get(ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        log.warning(
            "%s=%r is not a positive integer or 'auto'; choosing the thread count per request", ENV, value
        )
        return None
    return n
