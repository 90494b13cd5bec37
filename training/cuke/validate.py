"""Validating CuKe's pairs through the validator's batch API (never trusted from their source).

Every candidate goes through :func:`dice.validator.batch.validate_many` on a :class:`ValidatorPool` (workers
on every GPU of the machine; candidate code only ever runs in the pool's sandboxed runner processes). A pair
is kept when the verdict is ``correct`` under the full protocol and its speedup over eager PyTorch, timed live
on this machine's GPU, is at least ``min_speedup``. Without a GPU (``mode="compile"``, ``--no-gpu``) the
pool checks what a CPU can (Python syntax, the static guards, the device code with NVRTC) and the verdict is
``compiled``: such pairs are kept as *compiled only*, never as correct or fast, and the card says so.

Verdicts are cached in ``<out>/cache/verdicts.jsonl`` (one line per candidate, appended and flushed as each
finishes, keyed by the reference, the candidate, the mode and the tolerance), so a killed build resumes
where it stopped and a rebuild with another threshold re-validates nothing -- except a verdict whose timing
stopped early (``stop_below``): it serves a later build only when its pilot speedup is below that build's
cut-off too (the same run would have stopped there), else the candidate is timed again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dice.validator.verdict import FLAG_TIMING_STOPPED
from training.cuke.records import Pair, content_hash

MODES = ("gpu", "compile")
_GUARD = re.compile(r"rejected by guard ([A-Za-z_]+)")


@dataclass
class Checked:
    """What validation said about one candidate (a row of ``verdicts.jsonl``)."""

    key: str
    pair_id: str
    mode: str
    status: str
    compiled: bool
    correct: bool | None
    speedup: float | None
    ref_ms: float | None
    new_ms: float | None
    guard: str | None  # the guard that rejected it (status "rejected")
    message: str
    # the build's cut-off when timing ended after the pilot rounds (the speedup is the pilot's), else None
    stopped_below: float | None = None
    gpu: str | None = None  # the GPU the candidate was run and timed on (a GPU verdict's log names it)

    def kept(self, min_speedup: float) -> bool:
        if self.mode == "compile":
            return self.status == "compiled"
        # a kept pair was timed in full: a pilot's speedup (stopped_below) never keeps one
        fast = self.speedup is not None and self.speedup >= min_speedup and self.stopped_below is None
        return self.status == "correct" and fast


def cache_key(pair: Pair, mode: str, strict: bool) -> str:
    return content_hash(pair.pytorch_code, pair.cuda_code, mode, "strict" if strict else "1e-2")


def reusable(hit: Checked, stop_below: float | None, gpu: str | None = None) -> bool:
    """Whether a cached verdict answers a build with this cut-off on this GPU (None: not known): one timed
    on another GPU never; a fully timed one always; one whose timing stopped early only when its pilot
    speedup is below this cut-off as well."""
    if gpu is not None and hit.mode == "gpu" and hit.gpu != gpu:
        return False
    if hit.stopped_below is None:
        return True
    return stop_below is not None and hit.speedup is not None and hit.speedup < stop_below


def guard_name(message: str) -> str | None:
    m = _GUARD.search(message or "")
    return m.group(1) if m else None


class VerdictCache:
    """``verdicts.jsonl``: read at start, appended (and flushed) per verdict; the last line of a key wins.

    A line cut short by a kill is skipped on reading (its candidate is validated again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, Checked] = {}
        if path.is_file():
            with path.open(encoding="utf-8") as fh:
                for line in fh:
                    try:
                        row = Checked(**json.loads(line))
                    except (ValueError, TypeError):
                        continue
                    self.rows[row.key] = row
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # a line cut short by a kill: drop it before appending
                with path.open("r+b") as fh:
                    fh.truncate(data.rfind(b"\n") + 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("a", encoding="utf-8")

    def get(self, key: str) -> Checked | None:
        return self.rows.get(key)

    def put(self, row: Checked) -> None:
        self.rows[row.key] = row
        self._fh.write(json.dumps(asdict(row), allow_nan=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


_DEVICE = re.compile(r"^device: (.+?); \d+ warm-up", re.M)


def _device(log: str | None) -> str | None:
    """The GPU a verdict was timed on: its log's ``device: NAME; 3 warm-up, ...`` line."""
    m = _DEVICE.search(log or "")
    return m.group(1) if m else None


def _checked(pair: Pair, key: str, mode: str, verdict: Any) -> Checked:
    import math

    speedup = verdict.speedup if verdict.speedup is not None and math.isfinite(verdict.speedup) else None
    return Checked(
        key=key,
        pair_id=pair.id,
        mode=mode,
        status=verdict.status,
        compiled=bool(verdict.compiled),
        correct=verdict.correct,
        speedup=speedup,
        ref_ms=verdict.ref_ms,
        new_ms=verdict.new_ms,
        guard=guard_name(verdict.message) if verdict.status == "rejected" else None,
        gpu=_device(verdict.log) if mode == "gpu" else None,
        message=(verdict.message or "").splitlines()[0][:300] if verdict.message else "",
    )


def validate_pairs(
    pairs: Iterable[Pair],
    *,
    pool: Any,
    cache: VerdictCache,
    mode: str,
    strict: bool = False,
    deadline_s: float | None = 900.0,
    budget_s: float | None = None,
    stats: Any = None,
    on_result: Callable[[Pair, Checked, bool], None] | None = None,
    stop_below: float | None = None,
    gpu: str | None = None,
) -> Iterator[tuple[Pair, Checked]]:
    """Yield ``(pair, checked)`` for every pair with a candidate: cached verdicts first (``on_result``'s last
    argument says whether it came from the cache), then the rest through ``validate_many`` on ``pool`` as
    they finish. ``budget_s`` ends the uncached part after that many seconds (the pairs not answered by then
    get no verdict and no cache line: a rerun validates them); ``stats``, a ``BatchStats``, is filled.
    ``pool`` is a :class:`dice.validator.ValidatorPool` (or anything with its ``submit_kernelbench``; tests
    stub it there). References the validator refuses get a ``runtime_error``. ``stop_below``: the pool's early
    stop of timing (a candidate below it after the pilot rounds is not timed further; flagged). ``gpu``:
    this machine's GPU; a cached GPU verdict timed on another (or an unnamed) one is not reused, since a
    speedup is a property of the GPU it was timed on."""
    from dice.validator import InvalidReference, Verdict
    from dice.validator.batch import BatchTask, validate_many
    from dice.validator.reference import check_reference

    if mode not in MODES:
        raise ValueError(f"unknown validation mode {mode!r} (use one of {', '.join(MODES)})")
    todo: list[tuple[Pair, str]] = []
    for pair in pairs:
        if pair.cuda_code is None:
            continue
        key = cache_key(pair, mode, strict)
        hit = cache.get(key)
        if hit is not None and not reusable(hit, stop_below, gpu):
            hit = None
        if hit is not None:
            hit = Checked(**{**asdict(hit), "pair_id": pair.id})
            if on_result:
                on_result(pair, hit, True)
            yield pair, hit
            continue
        try:
            check_reference(pair.pytorch_code)
        except InvalidReference as exc:
            row = _checked(
                pair, key, mode, Verdict("runtime_error", False, message=f"invalid reference: {exc}")
            )
            cache.put(row)
            if on_result:
                on_result(pair, row, False)
            yield pair, row
            continue
        todo.append((pair, key))
    tasks = (
        BatchTask(
            p.pytorch_code,
            p.cuda_code or "",
            strict=strict,
            timing=mode == "gpu",
            deadline_s=deadline_s,
            key=(p, key),
            stop_below=stop_below if mode == "gpu" else None,
        )
        for p, key in todo
    )
    for task, verdict in validate_many(pool, tasks, budget_s=budget_s, stats=stats):
        pair, key = task.key
        row = _checked(pair, key, mode, verdict)
        if mode == "gpu" and row.gpu is None:  # no timing line (not timed): the machine's GPU ran it
            row.gpu = gpu
        if FLAG_TIMING_STOPPED in (verdict.flags or []):
            row.stopped_below = stop_below
        cache.put(row)
        if on_result:
            on_result(pair, row, False)
        yield pair, row
