"""TraceRL: the policy update of dLLM-RL / DICE, trained on the states the engine itself decoded through.

A rollout (:class:`TraceSample`) is a prompt, the response the engine generated, its step map (the row's
1-based denoising step that committed each response token, ``GenerationOutput.step_map``) and the sequence's
advantage. Instead of random masks, TraceRL rebuilds the partly masked blocks the model actually saw and
trains each token at the state it was decoded from.

Block grid: the engine's. Block ``b`` holds absolute positions ``[b*bs, (b+1)*bs)`` counted from the prompt's
first token, so the response's first block starts inside the prompt's tail (``len(prompt) % bs`` tokens),
which stays unmasked in every copy, as the engine's first decode block holds it. (The released rl_sdar.py
counts response blocks from the response start and prompt blocks backwards from it while its JetEngine
rollouts count from the prompt start: the two disagree whenever ``len(prompt) % bs != 0``.)

Copies: in each block, ``u_1 < u_2 < ...`` are the distinct steps of its response tokens; copy ``k`` masks
the block's response tokens with step >= ``u_k`` (the block as the engine fed it to step ``u_k``) and carries
the loss on the tokens with step == ``u_k``; ``shrink=s`` merges every ``s`` neighbouring steps into one copy.
Every response token is a loss token exactly once. A noised block sees the clean context before it and
itself only, so copy ``k`` of every block can share one noised segment. Layouts:

- rows (default, the reference's): one row ``[prompt | response | copy_k]`` per ``k``, the copy spanning
  the response's blocks (prompt tail included); a block with fewer than ``k`` copies stays clean there.
- packed (``packed=True``): one sequence per sample ``[prompt | response | copy_1 | copy_2 | ...]``, segment
  ``k`` holding only the blocks that have a ``k``-th copy, so the clean context is computed once.

Attention (one rule for both, :func:`trace_mask_mod`): clean tokens are block-causal over absolute positions
and never see a noised token; a noised token of block ``B`` in segment ``c`` sees clean blocks ``< B`` and
the tokens of block ``B`` in segment ``c`` (bidirectionally); padding is never attended. Position ids of a
copy repeat the absolute positions of what it copies.

Loss (:func:`trace_loss`): token-level PPO-clip with the sequence's advantage on each of its tokens,
per-sample sums normalised by the response length (or a fixed length, as the reference), averaged over
samples; k3 KL against the pre-update log-probs (the reference), a frozen reference model, or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

PAD_SEGMENT = -1  # segment id of padding (never attended)
CLEAN_SEGMENT = 0  # the clean prompt + response; noised segments are 1, 2, ...
FLEX_TILE = 128  # flex_attention's tile; flex rows are padded to a multiple of it
KL_MODES = ("old", "ref", "none")
NORMS = ("response", "fixed")


@dataclass(frozen=True)
class TraceSample:
    """One rollout: ``step_map[i]`` is the denoising step that committed ``response_ids[i]``."""

    prompt_ids: list[int]
    response_ids: list[int]
    step_map: list[int]
    advantage: float

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sample needs at least one prompt token (the engine refuses empty prompts)")
        if len(self.step_map) != len(self.response_ids):
            raise ValueError(
                f"step_map has {len(self.step_map)} entries for {len(self.response_ids)} response tokens"
            )


@dataclass(frozen=True)
class BlockCopy:
    """One block of one noised copy: the block as the engine held it before the step ``steps[0]``."""

    block: int  # absolute block index: positions block * bs ...
    copy: int  # 0-based: the block's k-th copy
    start: int  # absolute position of ids[0] (block * bs)
    ids: tuple[int, ...]  # prompt tail (first block only) and response tokens, mask_id where masked
    loss: tuple[bool, ...]  # per token: decoded at one of ``steps``, so the loss covers it
    steps: tuple[int, ...]  # the step values this copy trains (several when shrink > 1)


def block_copies(
    sample: TraceSample, *, block_size: int, mask_id: int, shrink: int = 1
) -> list[list[BlockCopy]]:
    """Per response block (in order), its copies: the states a rollout's step map says it went through.

    Copy ``k`` of a block masks the response tokens decoded at or after the first step of its group and
    trains those decoded inside the group (a group is ``shrink`` neighbouring distinct steps; the reference's
    ``collapse_k_unique`` maps each step to its group's last one, which gives the same masks and losses).
    """
    if block_size < 1 or shrink < 1:
        raise ValueError(f"block_size and shrink must be >= 1, got {block_size} and {shrink}")
    n, m = len(sample.prompt_ids), len(sample.response_ids)
    seq = [*sample.prompt_ids, *sample.response_ids]
    out: list[list[BlockCopy]] = []
    if m == 0:
        return out
    for b in range(n // block_size, (n + m - 1) // block_size + 1):
        start, end = b * block_size, min((b + 1) * block_size, n + m)
        steps = [sample.step_map[p - n] if p >= n else None for p in range(start, end)]
        distinct = sorted({s for s in steps if s is not None})
        copies = []
        for k, i in enumerate(range(0, len(distinct), shrink)):
            group = tuple(distinct[i : i + shrink])
            ids = tuple(
                mask_id if s is not None and s >= group[0] else t
                for s, t in zip(steps, seq[start:end], strict=True)
            )
            loss = tuple(s is not None and s in group for s in steps)
            copies.append(BlockCopy(b, k, start, ids, loss, group))
        out.append(copies)
    return out


@dataclass
class _Row:
    """One sequence of a batch being laid out, on the host."""

    sample: int
    ids: list[int]
    pos: list[int]
    seg: list[int]
    blk: list[int]
    loss_cols: list[int]
    targets: list[int]
    resp_idx: list[int]

    @classmethod
    def clean(cls, sample: int, seq: list[int], block_size: int) -> _Row:
        n = len(seq)
        blocks = [p // block_size for p in range(n)]
        return cls(sample, list(seq), list(range(n)), [CLEAN_SEGMENT] * n, blocks, [], [], [])

    def append(self, copy: BlockCopy, segment: int, prompt_len: int, response: list[int]) -> None:
        base, width = len(self.ids), len(copy.ids)
        self.ids += copy.ids
        self.pos += range(copy.start, copy.start + width)
        self.seg += [segment] * width
        self.blk += [copy.block] * width
        for j, flag in enumerate(copy.loss):
            if flag:
                i = copy.start + j - prompt_len
                self.loss_cols.append(base + j)
                self.targets.append(response[i])
                self.resp_idx.append(i)


def _sample_rows(
    index: int, sample: TraceSample, blocks: list[list[BlockCopy]], *, block_size: int, packed: bool
) -> list[_Row]:
    """The rows of one sample: one per copy index (rows), or one holding every copy (packed)."""
    seq = [*sample.prompt_ids, *sample.response_ids]
    n, response = len(sample.prompt_ids), list(sample.response_ids)
    depth = max((len(c) for c in blocks), default=0)
    if packed:
        row = _Row.clean(index, seq, block_size)
        for k in range(depth):
            for copies in blocks:
                if k < len(copies):
                    row.append(copies[k], k + 1, n, response)
        return [row] if depth else []
    rows = []
    for k in range(depth):
        row = _Row.clean(index, seq, block_size)
        for copies in blocks:
            if k < len(copies):
                row.append(copies[k], 1, n, response)
            else:  # the reference's row: this block has no k-th step, so it stays clean and untrained
                first = copies[0]
                clean = tuple(seq[first.start : first.start + len(first.ids)])
                untrained = BlockCopy(first.block, k, first.start, clean, (False,) * len(clean), ())
                row.append(untrained, 1, n, response)
        rows.append(row)
    return rows


@dataclass
class TraceBatch:
    """The rows of a TraceRL update and, per loss token, where it is and what it trains.

    Loss token ``j`` is ``input_ids[loss_rows[j], loss_cols[j]]`` (a masked slot or, with shrink, a merged
    step's slot); ``targets[j]`` is the response token it must predict, ``response_index[j]`` its index in
    the sample's response and ``sample_index[j]`` its sample (for per-sample normalisation).
    """

    input_ids: Tensor  # (R, T) long, pad_id after each row's end
    position_ids: Tensor  # (R, T) long: absolute positions (copies repeat them); 0 on padding
    mask: Any  # (R, 1, T, T) bool (True = may attend) or a flex_attention BlockMask
    segment: Tensor  # (R, T) PAD_SEGMENT, CLEAN_SEGMENT or the noised segment (1, 2, ...)
    block: Tensor  # (R, T) absolute block index of each token
    row_sample: Tensor  # (R,) the sample each row belongs to
    loss_rows: Tensor  # (N,) long
    loss_cols: Tensor  # (N,) long
    targets: Tensor  # (N,) long
    advantages: Tensor  # (N,) float32: the sample's advantage on each of its tokens
    sample_index: Tensor  # (N,) long
    response_index: Tensor  # (N,) long
    response_lens: Tensor  # (S,) long, one per sample given (empty responses included)

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def num_samples(self) -> int:
        return int(self.response_lens.numel())


def build_trace_batch(
    samples: list[TraceSample],
    *,
    block_size: int,
    mask_id: int,
    pad_id: int,
    shrink: int = 1,
    packed: bool = False,
    mask_impl: str = "dense",
    device: torch.device | str | None = None,
) -> TraceBatch:
    """Lay out the copies of ``samples`` as rows (or packed sequences), right-padded to one length.

    ``mask_impl`` "dense": a (R, 1, T, T) bool mask (small cases, SDPA); "flex": a flex_attention BlockMask
    built tile by tile (rows padded to a multiple of ``FLEX_TILE``). Samples with an empty response give no
    row but still count as samples. ValueError when no sample has a response token.
    """
    if mask_impl not in ("dense", "flex"):
        raise ValueError(f"mask_impl must be 'dense' or 'flex', got {mask_impl!r}")
    rows: list[_Row] = []
    for i, sample in enumerate(samples):
        blocks = block_copies(sample, block_size=block_size, mask_id=mask_id, shrink=shrink)
        rows += _sample_rows(i, sample, blocks, block_size=block_size, packed=packed)
    if not rows:
        raise ValueError("no sample has a response token to train on")
    width = max(len(r.ids) for r in rows)
    if mask_impl == "flex":
        width = -(-width // FLEX_TILE) * FLEX_TILE
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    seg = torch.full((len(rows), width), PAD_SEGMENT, dtype=torch.long)
    blk = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        t = len(row.ids)
        ids[r, :t], pos[r, :t] = torch.tensor(row.ids), torch.tensor(row.pos)
        seg[r, :t], blk[r, :t] = torch.tensor(row.seg), torch.tensor(row.blk)
    loss_rows = [r for r, row in enumerate(rows) for _ in row.loss_cols]
    sample_index = [row.sample for row in rows for _ in row.loss_cols]
    advantages = [float(samples[s].advantage) for s in sample_index]
    device = torch.device(device) if device is not None else torch.device("cpu")
    seg, blk = seg.to(device), blk.to(device)
    mask = dense_trace_mask(seg, blk) if mask_impl == "dense" else flex_trace_mask(seg, blk)

    def tensor(values: list, dtype: torch.dtype = torch.long) -> Tensor:
        return torch.tensor(values, dtype=dtype).to(device)

    return TraceBatch(
        input_ids=ids.to(device),
        position_ids=pos.to(device),
        mask=mask,
        segment=seg,
        block=blk,
        row_sample=tensor([row.sample for row in rows]),
        loss_rows=tensor(loss_rows),
        loss_cols=tensor([c for row in rows for c in row.loss_cols]),
        targets=tensor([t for row in rows for t in row.targets]),
        advantages=tensor(advantages, torch.float32),
        sample_index=tensor(sample_index),
        response_index=tensor([i for row in rows for i in row.resp_idx]),
        response_lens=tensor([len(s.response_ids) for s in samples]),
    )


def trace_mask_mod(segment: Tensor, block: Tensor):
    """The TraceRL attention rule as a flex_attention ``mask_mod(b, h, q_idx, kv_idx) -> bool``.

    ``segment``/``block`` (R, T): each token's segment (PAD_SEGMENT, CLEAN_SEGMENT, noised 1, 2, ...) and
    absolute block. A padding query sees only itself, so every query row has a key (no NaN) while no real
    token ever sees padding.
    """

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        q_seg, kv_seg = segment[b, q_idx], segment[b, kv_idx]
        q_blk, kv_blk = block[b, q_idx], block[b, kv_idx]
        kv_clean = kv_seg == CLEAN_SEGMENT
        clean_causal = (q_seg == CLEAN_SEGMENT) & kv_clean & (kv_blk <= q_blk)
        noised_context = (q_seg > CLEAN_SEGMENT) & kv_clean & (kv_blk < q_blk)
        noised_own = (q_seg > CLEAN_SEGMENT) & (kv_seg == q_seg) & (kv_blk == q_blk)
        pad_self = (q_seg == PAD_SEGMENT) & (q_idx == kv_idx)
        return clean_causal | noised_context | noised_own | pad_self

    return mask_mod


def dense_trace_mask(segment: Tensor, block: Tensor) -> Tensor:
    """The mask as a dense bool (R, 1, T, T), True = may attend. Only for small cases (tests, CPU)."""
    rows, width = segment.shape
    idx = torch.arange(width, device=segment.device)
    b = torch.arange(rows, device=segment.device)[:, None, None]
    return trace_mask_mod(segment, block)(b, None, idx[None, :, None], idx[None, None, :]).unsqueeze(1)


def flex_trace_mask(segment: Tensor, block: Tensor, *, tile: int = FLEX_TILE):
    """The mask as a flex_attention ``BlockMask``: empty tiles skipped, full ones without mask_mod calls.

    The tile summary is evaluated a few query tiles at a time (about 16 M mask entries per chunk), so a
    20k-token packed sequence never materialises its dense mask; as ``training.masks`` does, the BlockMask
    is assembled with ``from_kv_blocks``, without ``torch.compile`` (eager flex runs on the CPU too).
    """
    from torch.nn.attention.flex_attention import BlockMask

    rows, width = segment.shape
    device = segment.device
    n_tiles = -(-width // tile)
    mask_mod = trace_mask_mod(segment, block)
    keys = torch.arange(n_tiles * tile, device=device)
    key_valid = keys < width
    keys = keys.clamp(max=width - 1)
    b = torch.arange(rows, device=device)[:, None, None]
    any_tiles = torch.zeros(rows, n_tiles, n_tiles, dtype=torch.bool, device=device)
    all_tiles = torch.zeros_like(any_tiles)
    chunk = max(1, (1 << 24) // (rows * tile * n_tiles * tile))
    for q0 in range(0, n_tiles, chunk):
        q1 = min(n_tiles, q0 + chunk)
        queries = torch.arange(q0 * tile, q1 * tile, device=device)
        allowed = mask_mod(b, None, queries.clamp(max=width - 1)[None, :, None], keys[None, None, :])
        allowed = allowed & (queries < width)[:, None] & key_valid[None, :]  # cut tiles are never full
        allowed = allowed.view(rows, q1 - q0, tile, n_tiles, tile)
        any_tiles[:, q0:q1] = allowed.any(dim=4).any(dim=2)
        all_tiles[:, q0:q1] = allowed.all(dim=4).all(dim=2)
    kv_num, kv_idx = _tile_indices(any_tiles & ~all_tiles)
    full_num, full_idx = _tile_indices(all_tiles)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=tile, mask_mod=mask_mod, seq_lengths=(width, width)
    )


def _tile_indices(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """(R, Nq, Nk) bool -> (counts (R, 1, Nq), indices (R, 1, Nq, Nk)) int32, selected key tiles first."""
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts.unsqueeze(1), order.unsqueeze(1)


def token_logps(model, batch: TraceBatch) -> Tensor:
    """(N,) float32 log-prob of each loss token's target under ``model`` (a ``DiceModel``), with grad.

    The decoder runs on the whole layout under the batch's mask (``BlockDiffusionLM.hidden_states``, so
    gradient checkpointing applies as in SFT); the final norm and lm_head run on the loss positions only.
    Call it under ``torch.no_grad()`` before the update for the old (and reference) log-probs.
    """
    from training.objective import BlockDiffusionLM

    lm = BlockDiffusionLM(model)
    lm.train(model.training)
    h = lm.hidden_states(batch.input_ids, batch.position_ids, batch.mask)
    h = model.model.norm(h[batch.loss_rows, batch.loss_cols])  # (N, D)
    return -F.cross_entropy(model.lm_head(h).float(), batch.targets, reduction="none")


def trace_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    ref_logp: Tensor | None = None,
    clip_eps: float = 0.2,
    kl_beta: float = 0.01,
    kl_mode: str = "old",
    log_ratio_clamp: float = 10.0,
    norm: str = "response",
    fixed_len: int | None = None,
    sample_index: Tensor,
    response_lens: Tensor,
    num_samples: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The TraceRL loss over N loss tokens and its statistics.

    Per token: ``ratio = exp(clamp(new - old, ±log_ratio_clamp))``, surrogate ``min(ratio * A, clip(ratio,
    1 ± clip_eps) * A)`` with A the sequence's advantage, and the k3 estimator ``exp(base - new) - 1 + (new -
    base)`` of KL(policy || base), base = ``old_logp`` (kl_mode "old", the reference's choice), ``ref_logp``
    (a frozen reference model, "ref") or none. Per sample, both sums are divided by the response length
    (norm "response") or ``fixed_len`` (norm "fixed": the reference divides by its padded response length);
    the loss is ``-(policy) + kl_beta * kl`` averaged over ``num_samples`` (default ``len(response_lens)``;
    give the global count when one update's samples are split over micro-batches or ranks).

    Stats (floats): loss, policy_loss, kl_loss; kl (mean per-token k3 against the mode's base, against the
    old log-probs for "none"); clip_frac (tokens whose clipped branch is taken, so they get no gradient);
    ratio_mean, ratio_max; tokens.
    """
    if kl_mode not in KL_MODES:
        raise ValueError(f"kl_mode must be one of {KL_MODES}, got {kl_mode!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if kl_mode == "ref" and ref_logp is None:
        raise ValueError("kl_mode 'ref' needs ref_logp (the frozen reference model's log-probs)")
    if norm == "fixed" and not fixed_len:
        raise ValueError("norm 'fixed' needs fixed_len (e.g. max_new_tokens)")
    old_logp, advantages = old_logp.detach().to(new_logp), advantages.detach().to(new_logp)
    denominator = num_samples if num_samples is not None else int(response_lens.numel())
    if norm == "fixed":
        weight = torch.full_like(new_logp, 1.0 / fixed_len)
    else:
        weight = 1.0 / response_lens.to(new_logp).clamp(min=1)[sample_index]

    c = log_ratio_clamp
    ratio = torch.exp((new_logp - old_logp).clamp(-c, c))
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    policy = torch.minimum(unclipped, clipped)
    policy_loss = -(policy * weight).sum() / max(denominator, 1)

    base = old_logp if kl_mode != "ref" else ref_logp.detach().to(new_logp)
    k3 = torch.exp((base - new_logp).clamp(-c, c)) - 1.0 + (new_logp - base)
    if kl_mode == "none" or kl_beta == 0:
        kl_loss = new_logp.new_zeros(())
    else:
        kl_loss = kl_beta * (k3 * weight).sum() / max(denominator, 1)
    loss = policy_loss + kl_loss

    n = new_logp.numel()
    with torch.no_grad():
        empty = new_logp.new_zeros(())
        terms = [loss, policy_loss, kl_loss]
        if n:
            clip_frac = (clipped < unclipped).to(new_logp).mean()
            terms += [k3.mean(), clip_frac, ratio.mean(), ratio.max()]
        else:
            terms += [empty] * 4
        values = torch.stack(terms).tolist()
    names = ("loss", "policy_loss", "kl_loss", "kl", "clip_frac", "ratio_mean", "ratio_max")
    stats = dict(zip(names, values, strict=True))
    stats["tokens"] = float(n)
    return loss, stats


__all__ = [
    "TraceSample",
    "BlockCopy",
    "TraceBatch",
    "block_copies",
    "build_trace_batch",
    "trace_mask_mod",
    "dense_trace_mask",
    "flex_trace_mask",
    "token_logps",
    "trace_loss",
]
