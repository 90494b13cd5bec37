"""BiC-RL rollouts: G samples per task through the engine's batch path, with the step map TraceRL trains on.

DICE's settings are the defaults (JetEngine there): temperature 1.0, dynamic unmasking at 0.9, block 4, up to
4,096 new tokens, 16 samples per task. Rows are ``tasks x samples`` (task-major); they go to
``Engine.generate`` in chunks of whole groups of at most ``batch_rows`` rows (a group larger than that is cut
into pieces), so memory stays bounded while the G samples of a prompt still prefill it once.

What a rollout keeps, per token: the id and the *step map*, the row's 1-based denoising step that committed
it (``GenerationOutput.step_map``: the row's own step counter, which runs on across blocks, so it is
non-decreasing from block to block and gives the commit order inside a block). The response's block grid
starts at ``len(prompt_ids) % block_size`` (the prompt's tail shares the first block), exactly the grid the
rollout was decoded on: :meth:`Rollout.block_of` says which block a response token is in.

Where a response ends:

- a stop id (the tokenizer's ``<|im_end|>`` and eos): the stop token is *kept* as the response's last token
  with its step, so the update can teach the model to stop (``Engine.generate`` drops it; here the engine is
  asked with no stop ids and an ``until`` that ends a row at the block holding its first stop id: the same
  forwards, the stop token not lost). Tokens after it in that block are dropped.
- infilling tasks: where the suffix starts (or the code fence ends), as ``Engine.infill`` stops, checked
  incrementally per block (:class:`SuffixWatch`) so a long answer costs no quadratic re-decoding.
- the length cap ``max_new_tokens`` (``finished`` False); it is lowered for a chunk whose longest prompt
  would pass the model's context window.

Reproducible: chunk ``c`` decodes with a seed drawn from ``(seed, c)``, so the same tasks, settings, seed
and ``batch_rows`` give the same rollouts. Rows of a batch use one generator, so at temperature > 0 a row's
sample depends on the batch it was decoded in; at temperature 0 a batch gives what its rows give one by one
(``engine.decode``). The engine's prompt-prefix K/V cache is cleared first: the weights may have changed
since the last rollout, and stale K/V would decode from the old policy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from training.rl.tasks import Task, infill_plan

if TYPE_CHECKING:
    from torch import Tensor

    from engine.engine import Engine
    from engine.infill import InfillPlan

EndedBy = Literal["stop", "until", "budget"]
# A shaped hole's end (engine.shape) is re-parsed from the middle's start after each block; past this many
# characters the fill is far beyond any CuKe hole (<= 1,600) and only the suffix / fence watch goes on.
SHAPE_WATCH_CHARS = 4096
# Tokens decoded together while the text ends inside a UTF-8 character (U+FFFD): after this many the
# replacement characters are taken as they are (the model produced invalid bytes).
_MAX_PENDING = 8


@dataclass(frozen=True)
class Rollout:
    """One sample. ``response_ids`` / ``step_map`` (same length, 1-based steps) end with the stop token when
    ``ended_by == "stop"``; ``text`` is the decoded response without it; ``finished``: ended by a stop id or
    the end of the hole, not the length cap; ``steps``: the denoising steps the row took."""

    task_id: str
    sample: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    step_map: tuple[int, ...]
    text: str
    finished: bool
    ended_by: EndedBy = "budget"
    steps: int = 0

    def block_of(self, i: int, block_size: int) -> int:
        """The decode block of response token ``i``: the prompt's tail fills the first block's start."""
        return (len(self.prompt_ids) % block_size + i) // block_size


@dataclass(frozen=True)
class RolloutStats:
    """For the metrics: ``tokens_per_step`` = committed tokens / denoising steps over every row."""

    samples: int
    tokens: int
    steps: int
    tokens_per_step: float
    mean_length: float
    finished_rate: float

    def to_json(self) -> dict[str, float]:
        return {
            "samples": self.samples,
            "tokens": self.tokens,
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "mean_length": self.mean_length,
            "finished_rate": self.finished_rate,
        }


def rollout_stats(groups: Sequence[Sequence[Rollout]]) -> RolloutStats:
    """Tokens per denoising step, mean response length and the share that ended before the cap."""
    flat = [r for g in groups for r in g]
    tokens = sum(len(r.response_ids) for r in flat)
    steps = sum(r.steps for r in flat)
    n = len(flat)
    return RolloutStats(
        samples=n,
        tokens=tokens,
        steps=steps,
        tokens_per_step=tokens / steps if steps else 0.0,
        mean_length=tokens / n if n else 0.0,
        finished_rate=sum(r.finished for r in flat) / n if n else 0.0,
    )


class SuffixWatch:
    """Whether an infilling answer fed piece by piece already holds its whole middle: the rule of
    ``InfillPlan.reached_end`` (``engine.prompts.extract_middle``: the suffix's first non-blank line at a line
    start, or, when it need not start a line, anywhere the text before it leaves no bracket open; or the code
    fence's end; or, for a shaped hole, where a fill of that shape ends), found with searches over the new
    text only."""

    def __init__(self, plan: InfillPlan) -> None:
        self.plan = plan
        self.text = ""
        lines = plan.suffix.split("\n")
        first = next((i for i, line in enumerate(lines) if line.strip()), None)
        self.needles = ["```"]
        self.lead = ""  # prepended so an anchored match at the very start is found as "\n" + line
        self.mid_line: str | None = None  # found only where the text before it leaves no bracket open
        if first is not None:
            line = lines[first].rstrip()
            if first > 0 or plan.starts_line:
                self.needles.append("\n" + line)
                self.lead = "\n" if plan.starts_line else ""
            else:
                self.mid_line = line.strip()
                self.needles.append(self.mid_line)
        self.buffer = self.lead

    def feed(self, piece: str) -> bool:
        """Append ``piece``; True once the middle is complete."""
        from engine.prompts import closed_find

        old = len(self.buffer)
        self.text += piece
        self.buffer += piece
        for needle in self.needles:
            start = max(0, old - len(needle) + 1)
            find = closed_find if needle == self.mid_line else str.find
            if find(self.buffer, needle, start) >= 0:
                return True
        if self.plan.shape is not None and len(self.text) <= SHAPE_WATCH_CHARS:
            return self.plan.reached_end(self.text)
        return False


class _RowWatch:
    """``until`` for one row: a stop id among the new tokens, or (infilling) the end of the middle."""

    def __init__(
        self, stop_ids: frozenset[int], plan: InfillPlan | None, decode: Callable[[list[int]], str]
    ) -> None:
        self.stop_ids = stop_ids
        self.watch = SuffixWatch(plan) if plan is not None else None
        self.decode = decode
        self.seen = 0  # tokens checked for stop ids
        self.decoded = 0  # tokens whose text is in the watch

    def __call__(self, ids: list[int]) -> bool:
        if any(t in self.stop_ids for t in ids[self.seen :]):
            return True
        self.seen = len(ids)
        if self.watch is None:
            return False
        piece = self.decode(ids[self.decoded :])
        if piece.endswith("\ufffd") and len(ids) - self.decoded < _MAX_PENDING:
            return False  # a character cut between tokens: wait for its last byte
        self.decoded = len(ids)
        return self.watch.feed(piece)


def chunk_seed(seed: int, chunk: int) -> int:
    """The engine seed of chunk ``chunk`` (a hash of both: neighbouring chunks get unrelated streams)."""
    return random.Random(f"dice-rl-rollout:{seed}:{chunk}").getrandbits(62)


def plan_chunks(n_tasks: int, group_size: int, batch_rows: int | None) -> list[list[tuple[int, int, int]]]:
    """The engine batches: lists of (task index, first sample, samples) pieces. Whole groups while
    ``batch_rows`` holds at least one; else each group cut into pieces of ``batch_rows`` rows."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if batch_rows is not None and batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1 or None, got {batch_rows}")
    rows = batch_rows or n_tasks * group_size
    if rows >= group_size:
        per = rows // group_size
        return [[(t, 0, group_size) for t in range(s, min(s + per, n_tasks))] for s in range(0, n_tasks, per)]
    return [[(t, s, min(rows, group_size - s))] for t in range(n_tasks) for s in range(0, group_size, rows)]


@dataclass(frozen=True)
class RolloutSettings:
    """Decode settings shared by every chunk (DICE's rollout values by default)."""

    group_size: int = 16
    temperature: float = 1.0
    policy: str = "dynamic"
    threshold: float = 0.9
    block_size: int = 4
    max_new_tokens: int = 4096
    seed: int = 0
    batch_rows: int | None = None
    stop_at_suffix: bool = True
    kv_budget_bytes: int | None = None  # cap on one chunk's K/V cache: fewer rows per chunk when it binds
    top_p: float | None = None  # nucleus / top-k filtering of the sampled distribution (None: off, DICE)
    top_k: int | None = None
    identifier_scope: bool = False  # .cu infill tasks: spell only the prompt's words (engine.scope)


def rollout(
    engine: Engine,
    tasks: Sequence[Task],
    *,
    group_size: int = 16,
    temperature: float = 1.0,
    policy: str = "dynamic",
    threshold: float = 0.9,
    block_size: int = 4,
    max_new_tokens: int = 4096,
    seed: int = 0,
    batch_rows: int | None = None,
    stop_at_suffix: bool = True,
    top_p: float | None = None,
    top_k: int | None = None,
) -> list[list[Rollout]]:
    """``group_size`` samples of every task (``result[i][j]``: task ``i``, sample ``j``). See the module
    docstring for batching, stopping and seeding; :func:`rollout_chunks` yields the same groups as each
    engine batch finishes (to score one chunk while the next decodes)."""
    settings = RolloutSettings(
        group_size,
        temperature,
        policy,
        threshold,
        block_size,
        max_new_tokens,
        seed,
        batch_rows,
        stop_at_suffix,
        top_p=top_p,
        top_k=top_k,
    )
    groups: list[list[Rollout | None]] = [[None] * group_size for _ in tasks]
    for pieces in rollout_chunks(engine, tasks, settings):
        for index, first, rows in pieces:
            groups[index][first : first + len(rows)] = rows
    return [[r for r in g if r is not None] for g in groups]


def rollout_chunks(
    engine: Engine, tasks: Sequence[Task], settings: RolloutSettings
) -> Iterator[list[tuple[int, int, list[Rollout]]]]:
    """Decode chunk by chunk; yield each chunk's ``(task index, first sample, rollouts)`` pieces."""
    if not tasks:
        return
    engine.clear_prefix_cache()
    tok = engine.tokenizer
    stop_ids = frozenset(tok.stop_ids())
    prompts = [tok.encode(t.prompt) for t in tasks]
    plans = [infill_plan(t) if settings.stop_at_suffix else None for t in tasks]
    limit = engine.config.max_position_embeddings
    scopes = _scope_masks(engine, tasks) if settings.identifier_scope else None
    rows = rows_within_budget(engine, prompts, settings)
    for c, pieces in enumerate(plan_chunks(len(tasks), settings.group_size, rows)):
        row_tasks = [t for t, _first, n in pieces for _ in range(n)]
        row_samples = [first + j for _t, first, n in pieces for j in range(n)]
        longest = max(len(prompts[t]) for t in row_tasks)
        budget = min(settings.max_new_tokens, limit - longest)
        if budget < 1:
            worst = max(row_tasks, key=lambda t: len(prompts[t]))
            raise ValueError(
                f"task {tasks[worst].id!r}: its prompt ({len(prompts[worst])} tokens) leaves no room in the "
                f"model's context window ({limit} tokens)"
            )
        watches = [_RowWatch(stop_ids, plans[t], tok.decode) for t in row_tasks]
        out = engine.generate(
            [prompts[t] for t in row_tasks],
            max_new_tokens=budget,
            block_size=settings.block_size,
            policy=settings.policy,
            threshold=settings.threshold,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            stop_ids=[],
            seed=chunk_seed(settings.seed, c),
            until=lambda row, ids, w=watches: w[row](ids),
            allowed=None if scopes is None else scopes[row_tasks],
        )
        made = [
            _make_rollout(tasks[t], sample, prompts[t], ids, steps, stopped, stop_ids, tok.decode)
            for t, sample, ids, steps, stopped in zip(
                row_tasks, row_samples, out.ids, out.step_map, out.finished, strict=True
            )
        ]
        done: list[tuple[int, int, list[Rollout]]] = []
        row = 0
        for t, first, n in pieces:
            done.append((t, first, made[row : row + n]))
            row += n
        yield done


def _scope_masks(engine: Engine, tasks: Sequence[Task]) -> Tensor:
    """(tasks, V) bool, the tokens each task's rollouts may use: the prompt's words (``engine.scope``) for
    ``.cu`` infill tasks, as the assistant fills the same model's holes; every token for the other kinds (a
    whole program names new kernels and a KernelBench-format fill writes a new source string)."""
    import torch

    everything = torch.ones(engine.tokenizer.vocab_size, dtype=torch.bool)
    return torch.stack([engine.scope_mask(t.prompt) if t.kind == "cu_infill" else everything for t in tasks])


def rows_within_budget(
    engine: Engine, prompts: Sequence[Sequence[int]], settings: RolloutSettings
) -> int | None:
    """``settings.batch_rows``, lowered so that one chunk's K/V cache (rows x the slots the longest prompt
    and the length cap need, rounded as the engine rounds) stays within ``settings.kv_budget_bytes``; at
    least one row. None (one chunk) when neither bounds it."""
    rows = settings.batch_rows
    if settings.kv_budget_bytes is None or not prompts:
        return rows
    from engine.decode import slots_needed
    from engine.runner import cache_slots

    limit = engine.config.max_position_embeddings
    longest = max(len(p) for p in prompts)
    new = max(1, min(settings.max_new_tokens, limit - longest))
    slots = cache_slots(slots_needed([longest], settings.block_size, new))
    fit = max(1, settings.kv_budget_bytes // (slots * engine.kv_bytes_per_slot()))
    return fit if rows is None else min(rows, fit)


def _make_rollout(
    task: Task,
    sample: int,
    prompt: list[int],
    ids: list[int],
    steps: list[int],
    stopped: bool,
    stop_ids: frozenset[int],
    decode: Callable[[list[int]], str],
) -> Rollout:
    """A row of the engine's output cut after its first stop id (kept, with its step)."""
    row_steps = max(steps, default=0)
    cut = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    if cut is not None:
        ended: EndedBy = "stop"
        response, step_map, text = ids[: cut + 1], steps[: cut + 1], decode(ids[:cut])
    else:
        ended = "until" if stopped else "budget"
        response, step_map, text = ids, steps, decode(ids)
    return Rollout(
        task_id=task.id,
        sample=sample,
        prompt_ids=tuple(prompt),
        response_ids=tuple(response),
        step_map=tuple(step_map),
        text=text,
        finished=ended != "budget",
        ended_by=ended,
        steps=row_steps,
    )
