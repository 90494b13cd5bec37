"""TraceRL update (training.rl.trace): copies, masks, log-probs and the loss, on tiny CPU cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine.model import DiceModel
from engine.testing import make_tiny_checkpoint, tiny_config
from training.rl.trace import (
    TraceSample,
    block_copies,
    build_trace_batch,
    dense_trace_mask,
    token_logps,
    trace_loss,
)

MASK, PAD, BS = 63, 62, 4

# Two rollouts over two blocks each. A: prompt of 6 (tail 2 in block 1 = positions 4..7), response at
# positions 6..11: block 1 holds r0 r1 (steps 2, 1), block 2 holds r2..r5 (steps 3, 3, 4, 5).
# B: prompt of 8 (no tail), response r0..r2 in block 2 (steps 1, 1, 2).
SAMPLE_A = TraceSample(list(range(1, 7)), list(range(7, 13)), [2, 1, 3, 3, 4, 5], 1.5)
SAMPLE_B = TraceSample(list(range(1, 9)), [9, 10, 11], [1, 1, 2], -1.0)


pytestmark = pytest.mark.usefixtures("single_threaded_torch")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory):
    from engine import load_engine

    path: Path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "dice-tiny")
    return load_engine(path, device="cpu")


def tiny_model(dtype: torch.dtype = torch.float64) -> DiceModel:
    model = DiceModel(tiny_config(64, mask_token_id=MASK, pad_token_id=PAD))
    model.init_weights(std=0.2, seed=0)
    return model.to(dtype)


def token_keys(batch) -> list[tuple[int, int]]:
    """(sample, response index) of each loss token."""
    return list(zip(batch.sample_index.tolist(), batch.response_index.tolist(), strict=True))


def keyed(batch, values: dict[tuple[int, int], float]) -> torch.Tensor:
    """Per loss token, the value given for its (sample, response index)."""
    return torch.tensor([values[k] for k in token_keys(batch)], dtype=torch.float64)


def test_copies_and_rows_of_the_two_block_case() -> None:
    batch = build_trace_batch([SAMPLE_A, SAMPLE_B], block_size=BS, mask_id=MASK, pad_id=PAD)
    m = MASK
    # A: 3 rows (block 2 has 3 steps), copy over positions 4..11; B: 2 rows, copy over positions 8..10.
    assert batch.input_ids[:3, 12:].tolist() == [
        [5, 6, m, m, m, m, m, m],  # block 1 before step 1, block 2 before step 3
        [5, 6, m, 8, 9, 10, m, m],  # block 1 before step 2, block 2 before step 4
        [5, 6, 7, 8, 9, 10, 11, m],  # block 1 has no third step: clean, untrained; block 2 before step 5
    ]
    assert batch.position_ids[0].tolist() == list(range(12)) + list(range(4, 12))
    assert batch.input_ids[3:, 11:14].tolist() == [[m, m, m], [9, 10, m]]
    assert (batch.input_ids[3:, 14:] == PAD).all() and (batch.segment[3:, 14:] == -1).all()
    # Every response token is trained exactly once, from the row of its step.
    got = sorted((*k, r) for k, r in zip(token_keys(batch), batch.loss_rows.tolist(), strict=True))
    assert got == [
        (0, 0, 1),
        (0, 1, 0),
        (0, 2, 0),
        (0, 3, 0),
        (0, 4, 1),
        (0, 5, 2),
        (1, 0, 3),
        (1, 1, 3),
        (1, 2, 4),
    ]
    assert (batch.input_ids[batch.loss_rows, batch.loss_cols] == MASK).all()
    assert batch.advantages.tolist() == [1.5] * 6 + [-1.0] * 3


def test_mask_rule_on_the_two_block_case() -> None:
    batch = build_trace_batch([SAMPLE_A], block_size=BS, mask_id=MASK, pad_id=PAD)
    mask = batch.mask[0, 0]  # cols 0..11: clean positions 0..11; cols 12..19: the copy of positions 4..11
    assert mask[13, 3] and not mask[13, 4]  # copy block 1: clean block 0, not its own clean block
    assert mask[13, 12] and mask[13, 15] and not mask[13, 16]  # its own copy block, not copy block 2
    assert mask[16, 7] and not mask[16, 8] and not mask[16, 15] and mask[16, 19]  # copy block 2 alike
    assert mask[5, 7] and not mask[5, 8]  # the clean prompt tail sees its whole block (the engine's K/V)
    assert not mask[:12, 12:].any()  # the clean part never sees a copy


def test_loss_equals_a_hand_computation() -> None:
    batch = build_trace_batch([SAMPLE_A, SAMPLE_B], block_size=BS, mask_id=MASK, pad_id=PAD)
    delta = {
        (0, 0): 0.0,
        (0, 1): 0.1,
        (0, 2): -0.3,
        (0, 3): 0.5,
        (0, 4): 0.25,
        (0, 5): -0.1,
        (1, 0): 0.3,
        (1, 1): -0.4,
        (1, 2): 0.0,
    }
    old = keyed(batch, {k: -1.0 - 0.1 * k[1] for k in delta})
    new = old + keyed(batch, delta)
    e = math.exp
    # A (advantage 1.5): ratios 1, e^.1 inside; e^-.3 < 0.8 keeps the smaller unclipped term; e^.5 and
    # e^.25 > 1.2 are clipped to 1.2; e^-.1 inside.
    sum_a = 1.5 * (1 + e(0.1) + e(-0.3) + 1.2 + 1.2 + e(-0.1))
    # B (advantage -1): e^.3 > 1.2 keeps -e^.3 (smaller); e^-.4 < 0.8 is clipped to -0.8; ratio 1.
    sum_b = -(e(0.3) + 0.8 + 1.0)
    k3 = {k: e(-d) - 1 + d for k, d in delta.items()}
    kl_a = sum(v for k, v in k3.items() if k[0] == 0)
    kl_b = sum(v for k, v in k3.items() if k[0] == 1)
    common = dict(sample_index=batch.sample_index, response_lens=batch.response_lens)

    loss, stats = trace_loss(new, old, batch.advantages, **common)
    expected = -(sum_a / 6 + sum_b / 3) / 2 + 0.01 * (kl_a / 6 + kl_b / 3) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert stats["clip_frac"] == pytest.approx(3 / 9)  # A r3, A r4, B r1
    assert stats["tokens"] == 9 and stats["ratio_max"] == pytest.approx(e(0.5))

    fixed, _ = trace_loss(new, old, batch.advantages, norm="fixed", fixed_len=8, **common)
    assert fixed.item() == pytest.approx(-(sum_a + sum_b) / 8 / 2 + 0.01 * (kl_a + kl_b) / 8 / 2, rel=1e-12)
    global_count, _ = trace_loss(new, old, batch.advantages, num_samples=8, **common)
    assert global_count.item() == pytest.approx(expected * 2 / 8, rel=1e-12)


def record_decode(engine, prompt: list[int], max_new: int, seed: int):
    """Decode one prompt, keeping the (ids, pos) of every denoising forward the runner receives."""
    calls = []
    step = engine.runner.step

    def spy(cache, ids, pos, start, block_size):
        calls.append((ids[0].tolist(), pos[0].tolist()))
        return step(cache, ids, pos, start, block_size)

    engine.runner.step = spy
    try:
        out = engine.generate(
            prompt,
            max_new_tokens=max_new,
            policy="dynamic",
            threshold=0.5,
            temperature=1.0,
            seed=seed,
            stop_ids=[],
        )
    finally:
        del engine.runner.step
    return out, calls


@pytest.mark.parametrize(("prompt_len", "max_new", "seed"), [(8, 12, 1), (6, 10, 2), (5, 11, 1)])
def test_copies_equal_the_states_the_engine_decoded(tiny_engine, prompt_len, max_new, seed) -> None:
    """Forward f of a one-row decode is the row's step f: its current block must be the copy of that step
    (prompt tail included), and its previous clean block (a block's first step) the clean sequence."""
    text = "__global__ void relu_kernel(const float* x, float* y, int n) {"
    prompt = tiny_engine.tokenizer.encode(text)[:prompt_len]
    out, calls = record_decode(tiny_engine, prompt, max_new, seed)
    mask_id = tiny_engine.mask_id
    sample = TraceSample(prompt, out.ids[0], out.step_map[0], 1.0)
    assert len(sample.response_ids) == max_new and (prompt_len + max_new) % BS == 0  # whole last block
    seq = prompt + out.ids[0]
    copies = {
        (c.block, c.steps[0]): c for cs in block_copies(sample, block_size=BS, mask_id=mask_id) for c in cs
    }
    rows = build_trace_batch([sample], block_size=BS, mask_id=mask_id, pad_id=0)
    packed = build_trace_batch([sample], block_size=BS, mask_id=mask_id, pad_id=0, packed=True)
    seen = set()
    for f, (ids, pos) in enumerate(calls, start=1):
        block = pos[-BS] // BS
        assert pos[-BS:] == list(range(block * BS, (block + 1) * BS))
        if len(ids) == 2 * BS:
            assert pos[:BS] == list(range((block - 1) * BS, block * BS))
            assert ids[:BS] == seq[(block - 1) * BS : block * BS]
        copy = copies[(block, f)]
        assert list(copy.ids) == ids[-BS:]
        for batch, row, segment in ((rows, copy.copy, 1), (packed, 0, copy.copy + 1)):
            where = (batch.segment[row] == segment) & (batch.block[row] == block)
            assert batch.input_ids[row][where].tolist() == ids[-BS:]
            assert batch.position_ids[row][where].tolist() == pos[-BS:]
        seen.add((block, f))
    assert seen == set(copies)  # every copy is a state the engine decoded, and the other way round
    if prompt_len % BS:
        assert calls[0][0][: prompt_len % BS] == prompt[-(prompt_len % BS) :]  # the tail starts block 1


def reference_rows(sample: TraceSample, block_size: int, shrink: int) -> list[tuple[set[int], set[int]]]:
    """The released rl_sdar.py's rows, rewritten from its description: steps collapsed per response-relative
    block to the last of each group of ``shrink``; each round masks, per block, the steps >= the block's
    smallest remaining step and trains those equal to it. Returns (masked, trained) response indices."""
    steps = list(sample.step_map)
    for start in range(0, len(steps), block_size):
        distinct = sorted(set(steps[start : start + block_size]))
        rep = {
            v: distinct[min((i // shrink + 1) * shrink, len(distinct)) - 1] for i, v in enumerate(distinct)
        }
        steps[start : start + block_size] = [rep[v] for v in steps[start : start + block_size]]
    rows, left = [], list(steps)
    while any(s >= 0 for s in left):
        masked, trained = set(), set()
        for start in range(0, len(left), block_size):
            idx = [i for i in range(start, min(start + block_size, len(left))) if left[i] >= 0]
            if idx:
                low = min(left[i] for i in idx)
                masked |= {i for i in idx if left[i] >= low}
                trained |= {i for i in idx if left[i] == low}
        for i in trained:
            left[i] = -1
        rows.append((masked, trained))
    return rows


def our_rows(sample: TraceSample, shrink: int) -> list[tuple[set[int], set[int]]]:
    batch = build_trace_batch([sample], block_size=BS, mask_id=MASK, pad_id=PAD, shrink=shrink)
    n, m = len(sample.prompt_ids), len(sample.response_ids)
    out = []
    for r in range(batch.input_ids.shape[0]):
        copy = batch.input_ids[r, n + m :].tolist()
        offset = n - (n // BS) * BS  # the copy starts at the response's first block (prompt tail first)
        masked = {i for i in range(m) if copy[offset + i] == MASK}
        trained = set(batch.response_index[batch.loss_rows == r].tolist())
        out.append((masked, trained))
    return out


@pytest.mark.parametrize("shrink", [1, 2, 3, 4])
def test_rows_match_the_reference_rounds_on_an_aligned_prompt(shrink) -> None:
    sample = TraceSample([1] * 8, list(range(10, 21)), [4, 1, 3, 2, 5, 5, 7, 6, 9, 8, 8], 1.0)
    assert our_rows(sample, shrink) == reference_rows(sample, BS, shrink)


def test_shrink_merges_neighbouring_steps() -> None:
    sample = TraceSample([1] * 4, [10, 11, 12, 13], [4, 1, 3, 2], 1.0)
    by_shrink = {s: block_copies(sample, block_size=BS, mask_id=MASK, shrink=s)[0] for s in (1, 2, 3, 4)}
    assert [c.steps for c in by_shrink[1]] == [(1,), (2,), (3,), (4,)]
    two = by_shrink[2]
    assert [c.steps for c in two] == [(1, 2), (3, 4)]
    assert two[0].ids == (MASK,) * 4 and two[0].loss == (False, True, False, True)
    assert two[1].ids == (MASK, 11, MASK, 13) and two[1].loss == (True, False, True, False)
    assert [c.steps for c in by_shrink[3]] == [(1, 2, 3), (4,)]
    assert by_shrink[3][1].ids == (MASK, 11, 12, 13)
    assert len(by_shrink[4]) == 1 and all(by_shrink[4][0].loss)


def test_the_reference_grid_is_not_the_rollout_grid_when_the_prompt_has_a_tail() -> None:
    """rl_sdar.py cuts the response into blocks from its first token; the engine (and JetEngine) decode
    the prompt's tail in the response's first block. With a tail they train other states."""
    sample = TraceSample([1] * 6, list(range(10, 16)), [2, 1, 3, 3, 4, 5], 1.0)
    assert our_rows(sample, 1) != reference_rows(sample, BS, 1)
    aligned = TraceSample([1] * 8, sample.response_ids, sample.step_map, 1.0)
    assert our_rows(aligned, 1) == reference_rows(aligned, BS, 1)


def test_packed_and_unpacked_give_the_same_loss_and_gradients() -> None:
    model = tiny_model()
    sample_c = TraceSample([3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [1, 3, 2, 2, 5, 4, 6], 0.5)
    samples = [SAMPLE_A, SAMPLE_B, sample_c]
    rows = build_trace_batch(samples, block_size=BS, mask_id=MASK, pad_id=PAD)
    packed = build_trace_batch(samples, block_size=BS, mask_id=MASK, pad_id=PAD, packed=True)
    assert packed.input_ids.shape[0] == 3 and packed.input_ids.shape[1] < rows.input_ids.shape[1] * 3
    with torch.no_grad():
        base = token_logps(model, rows)
    pairs = zip(token_keys(rows), base.tolist(), strict=True)
    old = {k: v + 0.05 * math.sin(3 * i) for i, (k, v) in enumerate(pairs)}
    results = []
    for batch in (rows, packed):
        model.zero_grad()
        new = token_logps(model, batch)
        loss, _ = trace_loss(
            new,
            keyed(batch, old),
            batch.advantages,
            sample_index=batch.sample_index,
            response_lens=batch.response_lens,
        )
        loss.backward()
        logps = dict(zip(token_keys(batch), new.tolist(), strict=True))
        results.append((loss.detach(), logps, [p.grad.clone() for p in model.parameters()]))
    (loss_r, logp_r, grad_r), (loss_p, logp_p, grad_p) = results
    assert logp_r.keys() == logp_p.keys()
    assert all(logp_r[k] == pytest.approx(logp_p[k], abs=1e-10) for k in logp_r)
    assert torch.allclose(loss_r, loss_p, atol=1e-12)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grad_r, grad_p, strict=True))
    assert any(g.abs().sum() > 0 for g in grad_r)


@pytest.mark.parametrize("packed", [False, True])
def test_dense_and_flex_masks_agree(packed) -> None:
    pytest.importorskip("torch.nn.attention.flex_attention")
    from training.masks import block_mask_to_dense

    samples = [SAMPLE_A, SAMPLE_B]
    flex = build_trace_batch(
        samples, block_size=BS, mask_id=MASK, pad_id=PAD, packed=packed, mask_impl="flex"
    )
    rows = flex.input_ids.shape[0]
    assert torch.equal(block_mask_to_dense(flex.mask, rows), dense_trace_mask(flex.segment, flex.block))
    dense = build_trace_batch(samples, block_size=BS, mask_id=MASK, pad_id=PAD, packed=packed)
    model = tiny_model(torch.float32)
    with torch.no_grad():  # flex_attention has no backward on the CPU (torch 2.13); the GPU trains with it
        try:
            got = token_logps(model, flex)
        except NotImplementedError as exc:  # pragma: no cover - depends on the torch build
            pytest.skip(f"flex_attention does not run on this CPU build: {exc}")
        want = token_logps(model, dense)
    assert torch.equal(flex.targets, dense.targets)
    assert torch.allclose(got, want, atol=1e-5)


def _clip_case():
    # advantages and log-ratios: +A ratio>1+eps, +A ratio<1-eps, -A ratio<1-eps, -A ratio>1+eps, inside
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    old = torch.full((5,), -2.0, dtype=torch.float64)
    new = (old + torch.tensor([0.5, -0.5, -0.5, 0.5, 0.05], dtype=torch.float64)).requires_grad_()
    common = dict(sample_index=torch.zeros(5, dtype=torch.long), response_lens=torch.tensor([5]))
    return new, old, adv, common


def test_tokens_outside_the_clip_range_in_the_advantage_direction_get_no_gradient() -> None:
    new, old, adv, common = _clip_case()
    loss, stats = trace_loss(new, old, adv, kl_mode="none", **common)
    loss.backward()
    grad = new.grad.tolist()
    assert grad[0] == 0 and grad[2] == 0  # clipped: the ratio already moved past 1 ± eps that way
    assert grad[1] != 0 and grad[3] != 0 and grad[4] != 0  # the pessimistic unclipped term stays
    assert stats["clip_frac"] == pytest.approx(2 / 5)


def test_kl_modes() -> None:
    new, old, adv, common = _clip_case()
    ref = old - 0.2

    def k3(base: torch.Tensor) -> float:  # mean per-token k3 estimate
        return (torch.exp(base - new) - 1 + (new - base)).mean().item()

    none, s_none = trace_loss(new, old, adv, kl_mode="none", **common)
    assert s_none["kl_loss"] == 0 and none.item() == pytest.approx(s_none["policy_loss"])
    assert s_none["kl"] == pytest.approx(k3(old))  # reported against the old log-probs
    with_old, s_old = trace_loss(new, old, adv, kl_mode="old", kl_beta=0.1, **common)
    assert with_old.item() == pytest.approx(none.item() + 0.1 * k3(old))
    with_ref, s_ref = trace_loss(new, old, adv, kl_mode="ref", ref_logp=ref, kl_beta=0.1, **common)
    assert with_ref.item() == pytest.approx(none.item() + 0.1 * k3(ref))
    assert s_ref["kl_loss"] != pytest.approx(s_old["kl_loss"])
    zero_beta, _ = trace_loss(new, old, adv, kl_mode="ref", ref_logp=ref, kl_beta=0.0, **common)
    assert zero_beta.item() == pytest.approx(none.item())
    with pytest.raises(ValueError, match="ref_logp"):
        trace_loss(new, old, adv, kl_mode="ref", **common)
    with pytest.raises(ValueError, match="fixed_len"):
        trace_loss(new, old, adv, norm="fixed", **common)
    # At the pre-update point the old-KL term is zero and has no gradient.
    at_old = old.clone().requires_grad_()
    loss, stats = trace_loss(at_old, old, torch.zeros(5, dtype=torch.float64), kl_beta=1.0, **common)
    loss.backward()
    assert stats["kl"] == 0 and at_old.grad.abs().max() == 0
    # The log-ratio is clamped to ±10 before the exponential.
    _, stats = trace_loss(old + 30, old, adv, kl_mode="none", **common)
    assert stats["ratio_max"] == pytest.approx(math.exp(10))


def test_empty_responses_count_as_samples_and_an_empty_update_is_refused() -> None:
    empty = TraceSample([1, 2], [], [], 1.0)
    batch = build_trace_batch([SAMPLE_B, empty], block_size=BS, mask_id=MASK, pad_id=PAD)
    assert batch.num_samples == 2 and batch.input_ids.shape[0] == 2 and batch.num_tokens == 3
    with pytest.raises(ValueError, match="no sample"):
        build_trace_batch([empty], block_size=BS, mask_id=MASK, pad_id=PAD)
    with pytest.raises(ValueError, match="step_map"):
        TraceSample([1], [2, 3], [1], 0.0)
