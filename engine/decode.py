"""The block-diffusion decode loop (one loop; policies, sampling and the forward runner are plugged in).

Prompt handling follows SDAR: a prompt's whole blocks are prefilled into the cache; its tail (length % block)
starts the first decode block, followed by mask slots. Whole blocks found in a ``PrefixCache`` are copied
in instead of recomputed (see ``prefill``). Rows of a batch are left-padded by whole blocks so that their
current blocks share cache slots, and decode in lockstep; each row keeps its own positions, step
counter and stop state, so a batch gives what its rows give one by one. Each denoising step samples every
masked slot and the policy commits some; committed tokens are never re-masked. The forward that starts a
block also carries the previous, now complete block, which writes its clean K/V (SDAR runs that as a
separate forward). The only host syncs are one per block (stop checks), plus one per step for the
threshold policies (has every slot been committed?) and when ``on_step`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine.kv_cache import KVCache, PrefixCache
from engine.runner import EagerRunner
from engine.sampling import POLICIES, SamplingParams, sample_tokens, transfer_schedule


@dataclass(frozen=True)
class StepEvent:
    """Reported after every denoising step (``on_step`` may raise to cancel)."""

    block: int  # decode block index, 0 = the block holding the prompt tail
    step: int  # denoising step within the block, 0-based
    total_steps: int  # forwards so far in this generation
    committed: int  # generated tokens committed so far, all rows


@dataclass(frozen=True)
class BlockEvent:
    """Reported after every block (``on_block``): what each row holds so far, on the host.

    The lists are the loop's own (read them, never change them); a row's lists only grow, and a row whose
    ``finished`` is True gets no more tokens. A server streams from it and answers a finished row at once.
    """

    block: int
    ids: list[list[int]]  # per row: new tokens so far (stop token excluded)
    step_map: list[list[int]]
    confidences: list[list[float]]
    finished: list[bool]  # no more tokens for this row (stop id, ``until`` or the budget)
    stopped: list[bool]  # finished by a stop id or ``until``, not by the budget


@dataclass
class GenerationOutput:
    ids: list[list[int]]  # new tokens per row, stop token and anything after it excluded
    step_map: list[
        list[int]
    ]  # per token: the row's 1-based denoising step that committed it (as DICE's rollouts)
    confidences: list[list[float]]  # per token: the confidence it was committed with
    finished: list[bool] = field(
        default_factory=list
    )  # True: stopped by a stop id / ``until``; False: budget
    steps: int = 0  # denoising forwards run


@dataclass(frozen=True)
class DecodeSettings:
    block_size: int
    steps_per_block: int
    max_new_tokens: int
    mask_id: int
    pad_id: int
    policy: str = "static"
    threshold: float = 0.9
    sampling: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (use one of {sorted(POLICIES)})")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        transfer_schedule(self.block_size, self.steps_per_block)


def slots_needed(prompt_lengths: Sequence[int], block_size: int, max_new_tokens: int) -> int:
    """Cache slots for a batch: the longest whole-block prefix plus the decode blocks of the longest tail."""
    prefill = max(n // block_size for n in prompt_lengths)
    tail = max(n % block_size for n in prompt_lengths)
    return (prefill + -(-(tail + max_new_tokens) // block_size)) * block_size


def prefill(
    runner: EagerRunner,
    cache: KVCache,
    prompts: Sequence[Sequence[int]],
    full_blocks: Sequence[int],
    offsets: Sequence[int],
    pad_id: int,
    prefix_cache: PrefixCache | None = None,
) -> None:
    """Fill slots [offsets[b], end) of every row with the K/V of its prompt's whole blocks.

    Rows with the same whole-block prompt are computed once and copied; K/V found in ``prefix_cache`` are
    copied in, and one forward over the distinct rows covers the slots that are left (from the earliest
    such slot, so a row that reused more recomputes a few blocks in the same batched forward). Chunked this
    way the K/V equal a one-forward prefill's up to float rounding (GEMMs of other shapes).
    """
    bs = cache.block_size
    end = max(full_blocks) * bs
    keys = [tuple(p[: n * bs]) for p, n in zip(prompts, full_blocks, strict=True)]
    first: dict[tuple[int, ...], int] = {}
    source = [first.setdefault(key, i) for i, key in enumerate(keys)]  # row -> row computing its prefix
    distinct = sorted(first.values())
    todo = {}  # distinct row -> first slot it still needs
    for r in distinct:
        reused = 0
        if prefix_cache is not None and keys[r]:
            reused, k, v = prefix_cache.lookup(keys[r], bs)
            if reused:
                cache.load(r, offsets[r], k, v)
        todo[r] = offsets[r] + reused
    begin = min(todo.values())
    if begin < end:
        sub, is_view = cache.rows(distinct)
        width = end - begin
        ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
        for j, r in enumerate(distinct):
            lo = max(begin, offsets[r])  # slots before offsets[r] are this row's left padding
            ids[j, lo - begin :] = torch.tensor(keys[r][lo - offsets[r] :])
        device = cache.k.device
        row_offsets = torch.tensor([offsets[r] for r in distinct], device=device)[:, None]
        pos = (begin + torch.arange(width, device=device)[None] - row_offsets).clamp(min=0)
        runner.prefill(sub, ids.to(device), pos, begin)
        if not is_view:
            cache.put_rows(distinct, sub, end)
    copies = [i for i, r in enumerate(source) if r != i]
    if copies:
        cache.copy_rows([source[i] for i in copies], copies, end)
    if prefix_cache is not None:
        for r in distinct:
            if keys[r] and todo[r] < offsets[r] + len(keys[r]):  # something new was computed
                prefix_cache.store(keys[r], bs, *cache.read(r, offsets[r], len(keys[r])))


@dataclass
class _Rows:
    """What the loop has collected per row, on the host (filled once per block by ``_collect_block``)."""

    ids: list[list[int]]
    steps: list[list[int]]
    confidences: list[list[float]]
    finished: list[bool]  # no more tokens for this row (stop id, ``until`` or the budget)
    stopped: list[bool]  # finished by a stop id or ``until``, not by the budget

    @classmethod
    def empty(cls, b: int) -> _Rows:
        return cls(
            [[] for _ in range(b)], [[] for _ in range(b)], [[] for _ in range(b)], [False] * b, [False] * b
        )

    @property
    def committed(self) -> int:
        return sum(len(o) for o in self.ids)


@dataclass
class _Block:
    """The block being denoised: its tokens and which of its slots are generated (not the prompt tail)."""

    x: Tensor  # (B, bs) token ids, mask_id where not committed yet
    generated: Tensor  # (B, bs) bool: slots that belong to the answer
    step_map: Tensor  # (B, bs) the row's 1-based step that committed each slot (0: not committed)
    conf_map: Tensor  # (B, bs) the confidence each slot was committed with


@torch.inference_mode()
def decode(
    runner: EagerRunner,
    prompts: Sequence[Sequence[int]],
    settings: DecodeSettings,
    *,
    device: torch.device | str,
    generator: torch.Generator | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
    until: Callable[[int, list[int]], bool] | None = None,
    prefix_cache: PrefixCache | None = None,
    on_block: Callable[[BlockEvent], None] | None = None,
    allowed: Tensor | None = None,
) -> GenerationOutput:
    """Generate for every prompt. ``until(row, ids)`` is asked after each block whether a row is done;
    ``on_block`` is told after each block what every row holds (it may raise to stop, as ``on_step``).

    ``prefix_cache``: reuse (and remember) the K/V of prompt prefixes shared with earlier prompts.
    ``allowed``: (V,) or (B, V) bool over the logits' V ids, the tokens each row may produce
    (``engine.scope``); None: all."""
    s = settings
    bs = s.block_size
    b = len(prompts)
    lengths = [len(p) for p in prompts]
    if b == 0:
        raise ValueError("no prompts given")
    if min(lengths) == 0:
        raise ValueError("every prompt needs at least one token")
    if s.max_new_tokens == 0:
        return GenerationOutput(
            [[] for _ in prompts], [[] for _ in prompts], [[] for _ in prompts], [False] * b
        )

    full_blocks = [n // bs for n in lengths]
    tails = [n % bs for n in lengths]
    prefill_blocks = max(full_blocks)
    offsets = [(prefill_blocks - nb) * bs for nb in full_blocks]  # left padding, whole blocks
    cache = runner.new_cache(b, slots_needed(lengths, bs, s.max_new_tokens), bs)
    cache.reset(offsets)
    runner.prepare(cache, (bs, 2 * bs), bs)

    offsets_t = torch.tensor(offsets, device=device)[:, None]  # (B, 1)
    arange_bs = torch.arange(bs, device=device)
    if prefill_blocks:
        prefill(runner, cache, prompts, full_blocks, offsets, s.pad_id, prefix_cache)

    # First decode block: each row's prompt tail, then masks.
    x = torch.full((b, bs), s.mask_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        if tails[i]:
            x[i, : tails[i]] = torch.tensor(p[len(p) - tails[i] :])
    x = x.to(device)
    generated = (arange_bs[None] >= torch.tensor(tails, device=device)[:, None]).clone()  # (B, bs)
    loop = _Loop(runner, cache, s, generator, on_step, device)
    if allowed is not None:
        loop.banned = _banned(allowed, b, device)
    rows = _Rows.empty(b)
    active = torch.ones(b, 1, dtype=torch.bool, device=device)
    prev_clean: Tensor | None = None
    block = 0
    while True:
        start_slot = (prefill_blocks + block) * bs
        pos = start_slot + arange_bs[None] - offsets_t  # (B, bs)
        # Steps a static block needs: its largest number of masked slots, spent by the schedule.
        n_masked = bs - (min(tails) if block == 0 else 0)
        current = loop.denoise_block(
            x, generated, active, pos, start_slot, prev_clean, block, n_masked, rows.committed
        )
        _collect_block(current, rows, s, until)
        if on_block is not None:
            on_block(BlockEvent(block, rows.ids, rows.steps, rows.confidences, rows.finished, rows.stopped))
        if all(rows.finished):
            break
        active = torch.tensor([not f for f in rows.finished], device=device)[:, None]
        prev_clean = current.x
        x = torch.full((b, bs), s.mask_id, dtype=torch.long, device=device)
        generated = torch.ones(b, bs, dtype=torch.bool, device=device)
        block += 1

    return GenerationOutput(rows.ids, rows.steps, rows.confidences, rows.stopped, loop.total_steps)


class _Loop:
    """The denoising half of the loop: the runner, the policy and the per-row step counters, across blocks."""

    def __init__(
        self,
        runner: EagerRunner,
        cache: KVCache,
        settings: DecodeSettings,
        generator: torch.Generator | None,
        on_step: Callable[[StepEvent], None] | None,
        device: torch.device | str,
    ) -> None:
        self.runner, self.cache, self.s = runner, cache, settings
        self.generator, self.on_step, self.device = generator, on_step, device
        self.policy = POLICIES[settings.policy]
        self.schedule = transfer_schedule(settings.block_size, settings.steps_per_block)
        self.threshold_policy = settings.policy != "static"
        self.need_entropy = settings.policy == "entropy"
        self.row_steps: Tensor | None = None  # (B, 1) steps each row has taken (made with the first block)
        self.total_steps = 0
        self.banned: Tensor | None = None  # (B, 1, V) bool: tokens a row may not produce

    def _static_steps(self, n_masked: int) -> int:
        steps, spent = 0, 0
        while spent < n_masked:
            spent += self.schedule[min(steps, len(self.schedule) - 1)]
            steps += 1
        return steps

    def denoise_block(
        self,
        x: Tensor,
        generated: Tensor,
        active: Tensor,
        pos: Tensor,
        start_slot: int,
        prev_clean: Tensor | None,
        block: int,
        n_masked: int,
        committed_before: int,
    ) -> _Block:
        """Denoise one block until the policy has committed every slot (threshold policies) or the static
        schedule is spent. The first forward also carries ``prev_clean``, the previous block, which writes
        its clean K/V; committed tokens are never re-masked."""
        s, bs, device = self.s, self.s.block_size, self.device
        b = x.shape[0]
        if self.row_steps is None:
            self.row_steps = torch.zeros(b, 1, dtype=torch.long, device=device)
        masked = generated & active
        step_map = torch.zeros(b, bs, dtype=torch.long, device=device)
        conf_map = torch.zeros(b, bs, dtype=torch.float32, device=device)
        static_steps = self._static_steps(n_masked)
        step = 0
        while True:
            if self.threshold_policy:
                if not bool(masked.any()):
                    break
            elif step >= static_steps:
                break
            if prev_clean is not None:
                ids = torch.cat([prev_clean, x], 1)
                ids_pos = torch.cat([pos - bs, pos], 1)
                start = torch.full((1,), start_slot - bs, dtype=torch.long, device=device)
                prev_clean = None
            else:
                ids, ids_pos = x, pos
                start = torch.full((1,), start_slot, dtype=torch.long, device=device)  # no H2D copy
            logits = self.runner.step(self.cache, ids, ids_pos, start, bs)  # (B, bs, V)
            logits[..., s.mask_id] = float("-inf")  # the mask token is never a prediction
            if self.banned is not None:
                logits.masked_fill_(self.banned, float("-inf"))
            tokens, confidence, entropy = sample_tokens(
                logits, s.sampling, self.generator, need_entropy=self.need_entropy
            )
            quota = self.schedule[min(step, len(self.schedule) - 1)]
            commit = self.policy(confidence, entropy, masked, quota, s.threshold) & masked
            self.row_steps += masked.any(-1, keepdim=True)
            x = torch.where(commit, tokens, x)
            step_map = torch.where(commit, self.row_steps, step_map)
            conf_map = torch.where(commit, confidence, conf_map)
            masked = masked & ~commit
            step += 1
            self.total_steps += 1
            if self.on_step is not None:
                committed = committed_before + int((generated & ~masked).sum())
                self.on_step(StepEvent(block, step - 1, self.total_steps, committed))
        return _Block(x, generated, step_map, conf_map)


def _banned(allowed: Tensor, rows: int, device: torch.device | str) -> Tensor:
    """(B, 1, V) bool from a (V,) or (B, V) ``allowed`` mask."""
    allowed = torch.as_tensor(allowed, dtype=torch.bool)
    if allowed.dim() == 1:
        allowed = allowed[None].expand(rows, -1)
    if allowed.dim() != 2 or allowed.shape[0] != rows:
        raise ValueError(f"allowed must be (V,) or ({rows}, V), got {tuple(allowed.shape)}")
    if not bool(allowed.any(-1).all()):
        raise ValueError("allowed leaves a row no token to produce")
    return (~allowed).to(device)[:, None, :]


def _collect_block(
    block: _Block, rows: _Rows, s: DecodeSettings, until: Callable[[int, list[int]], bool] | None
) -> None:
    """The collecting half: one host sync per block to append its committed tokens to each unfinished row
    and decide which rows stop (a stop id, ``until``, or the token budget)."""
    x_host, steps_host, conf_host = block.x.tolist(), block.step_map.tolist(), block.conf_map.tolist()
    gen_host = block.generated.tolist()
    for i in range(len(x_host)):
        if rows.finished[i]:
            continue
        for j in range(len(x_host[i])):
            if not gen_host[i][j] or len(rows.ids[i]) >= s.max_new_tokens:
                continue
            if x_host[i][j] in s.stop_ids:
                rows.finished[i] = rows.stopped[i] = True
                break
            rows.ids[i].append(x_host[i][j])
            rows.steps[i].append(steps_host[i][j])
            rows.confidences[i].append(conf_host[i][j])
        if not rows.finished[i] and until is not None and until(i, rows.ids[i]):
            rows.finished[i] = rows.stopped[i] = True
        if len(rows.ids[i]) >= s.max_new_tokens:
            rows.finished[i] = True
