"""The decode loop: cached == uncached, batching, policies, sampling, stops, cancellation, compat mode."""

from __future__ import annotations

import pytest
import torch

import engine.locate
from engine import Cancelled, CheckpointError, Engine, StepEvent, load_engine
from engine.sampling import (
    SamplingParams,
    dynamic_policy,
    entropy_policy,
    filter_logits,
    sample_tokens,
    static_policy,
    transfer_schedule,
)


@pytest.fixture(scope="module")
def eng(tiny_ckpt) -> Engine:
    return load_engine(tiny_ckpt, device="cpu")


@pytest.fixture(scope="module")
def prompts(eng) -> list[list[int]]:
    tok = eng.tokenizer
    texts = [
        "__global__ void relu_kernel(const float* x, float* y, int n) {",
        "import torch.nn as nn",
        "import torch",
        "<|im_start|>user\nWrite a softmax kernel<|im_end|>\n<|im_start|>assistant\n",
        "a",
    ]
    ids = [tok.encode(t) for t in texts]
    assert {len(p) % 4 for p in ids} == {0, 1, 2, 3}  # every prompt-tail length of a block of 4
    return ids


def uncached_decode(
    eng: Engine, prompt: list[int], *, max_new: int, steps: int, policy, threshold: float = 0.9
):
    """Reference: full block-causal forward over the whole sequence at every step (no cache, batch 1)."""
    bs, mask_id = eng.config.block_size, eng.mask_id
    schedule = transfer_schedule(bs, steps)
    tail = len(prompt) % bs
    block_start = len(prompt) - tail
    x = prompt[block_start:] + [mask_id] * (bs - tail)
    dev = eng.device
    masked = torch.tensor([[False] * tail + [True] * (bs - tail)], device=dev)
    done: list[int] = prompt[:block_start]
    ids, step_map, n_steps = [], [], 0
    while len(ids) < max_new:
        step, smap = 0, [0] * bs
        while masked.any():
            with torch.no_grad():
                logits = eng.model(torch.tensor([done + x], device=dev))[:, block_start:].float()
            logits[..., mask_id] = float("-inf")
            tokens, conf, ent = sample_tokens(logits, SamplingParams(), need_entropy=True)
            commit = policy(conf, ent, masked, schedule[min(step, steps - 1)], threshold) & masked
            n_steps += 1
            for j in range(bs):
                if commit[0, j]:
                    x[j] = int(tokens[0, j])
                    smap[j] = n_steps
            masked &= ~commit
            step += 1
        new = [j for j in range(bs) if block_start + j >= len(prompt)]
        ids += [x[j] for j in new]
        step_map += [smap[j] for j in new]
        done = done + x
        block_start += bs
        x = [mask_id] * bs
        masked = torch.ones(1, bs, dtype=torch.bool, device=dev)
    return ids[:max_new], step_map[:max_new]


@pytest.mark.parametrize(
    ("policy_name", "policy", "steps"),
    [("static", static_policy, 4), ("static", static_policy, 2), ("dynamic", dynamic_policy, 4)],
)
def test_cached_equals_uncached_at_temperature_zero(eng, prompts, policy_name, policy, steps):
    for prompt in prompts[:4]:
        out = eng.generate(
            prompt, max_new_tokens=14, steps_per_block=steps, policy=policy_name, threshold=0.5, stop_ids=[]
        )
        ref_ids, ref_steps = uncached_decode(
            eng, prompt, max_new=14, steps=steps, policy=policy, threshold=0.5
        )
        assert out.ids[0] == ref_ids
        assert out.step_map[0] == ref_steps


def test_mixed_length_batch_equals_one_by_one(eng, prompts):
    for kwargs in (
        {"policy": "static"},
        {"policy": "dynamic", "threshold": 0.4},
        {"policy": "entropy", "threshold": 2.0},
    ):
        batch = eng.generate(prompts, max_new_tokens=11, stop_ids=[], **kwargs)
        for i, prompt in enumerate(prompts):
            one = eng.generate(prompt, max_new_tokens=11, stop_ids=[], **kwargs)
            assert batch.ids[i] == one.ids[0], (kwargs, i)
            assert batch.step_map[i] == one.step_map[0], (kwargs, i)
            assert batch.confidences[i] == pytest.approx(one.confidences[0], abs=1e-5)


def test_policy_functions_commit_what_they_claim():
    conf = torch.tensor([[0.95, 0.20, 0.99, 0.50], [0.30, 0.40, 0.10, 0.92]])
    masked = torch.tensor([[True, True, False, True], [True, True, True, True]])
    ent = torch.tensor([[0.1, 2.0, 0.0, 0.3], [1.0, 0.2, 0.5, 0.05]])
    # static: the `quota` most confident masked slots, never a committed one
    assert static_policy(conf, ent, masked, 2, 0.9).tolist() == [
        [True, False, False, True],
        [False, True, False, True],
    ]
    assert static_policy(conf, ent, masked, 9, 0.9).tolist() == masked.tolist()
    # dynamic: all above threshold when at least `quota` are, else the top `quota`
    assert dynamic_policy(conf, ent, masked, 1, 0.9).tolist() == [
        [True, False, False, False],
        [False, False, False, True],
    ]
    assert dynamic_policy(conf, ent, masked, 2, 0.9).tolist() == [
        [True, False, False, True],
        [False, True, False, True],
    ]
    assert dynamic_policy(conf, ent, masked, 1, 0.0).tolist() == masked.tolist()
    # entropy: lowest entropies while their running sum stays below the budget, at least one
    assert entropy_policy(conf, ent, masked, 1, 0.5).tolist() == [
        [True, False, False, True],
        [False, True, False, True],
    ]
    assert entropy_policy(conf, ent, masked, 1, 0.3).tolist() == [
        [True, False, False, False],
        [False, True, False, True],
    ]
    assert entropy_policy(conf, ent, masked, 1, 0.01).tolist() == [
        [True, False, False, False],
        [False, False, False, True],
    ]
    assert transfer_schedule(4, 4) == [1, 1, 1, 1]
    assert transfer_schedule(4, 3) == [2, 1, 1]
    assert transfer_schedule(4, 1) == [4]
    with pytest.raises(ValueError):
        transfer_schedule(4, 0)


def test_policies_in_generation(eng, prompts):
    prompt = prompts[2]  # two tokens: the first block holds them and two masks
    n = 14  # ends on a block boundary
    tail = len(prompt) % 4
    assert tail == 2

    def per_step_counts(step_map: list[int]) -> list[int]:
        return [step_map.count(s) for s in sorted(set(step_map))]

    two = eng.generate(prompt, max_new_tokens=n, steps_per_block=2, stop_ids=[])
    assert per_step_counts(two.step_map[0]) == [2] * 7 and two.steps == 7
    one_shot = eng.generate(prompt, max_new_tokens=n, steps_per_block=1, stop_ids=[])
    assert one_shot.steps == -(-(tail + n) // 4)  # one step per block
    everything = eng.generate(prompt, max_new_tokens=n, policy="dynamic", threshold=0.0, stop_ids=[])
    assert everything.steps == one_shot.steps  # every masked slot beats threshold 0
    strict = eng.generate(prompt, max_new_tokens=n, policy="dynamic", threshold=1.0, stop_ids=[])
    assert strict.steps == eng.generate(prompt, max_new_tokens=n, stop_ids=[]).steps  # falls back to quota 1
    assert strict.ids == eng.generate(prompt, max_new_tokens=n, stop_ids=[]).ids
    # committed tokens are never re-masked: each token has exactly one commit step
    sm = two.step_map[0]
    assert all(s >= 1 for s in sm) and len(sm) == n


def test_confidences_are_unfiltered_probabilities(eng, prompts):
    out = eng.generate(prompts[0], max_new_tokens=8, stop_ids=[])
    assert all(0.0 < c < 1.0 for c in out.confidences[0])
    with torch.no_grad():
        full = eng.logits([prompts[0] + out.ids[0]])
    assert full.shape == (1, len(prompts[0]) + 8, eng.config.vocab_size)


def test_sampling_params_and_filters():
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0]]])
    assert torch.isinf(filter_logits(logits, 2, None)[0, 0, 2:]).all()
    kept = filter_logits(logits, None, 0.7)
    assert torch.isfinite(kept[0, 0, :2]).all() and torch.isinf(kept[0, 0, 2:]).all()
    tokens, conf, _ = sample_tokens(
        logits, SamplingParams(temperature=1.0, top_k=1, filtered_confidence=True)
    )
    assert tokens.item() == 0 and conf.item() == 1.0
    tokens, conf, _ = sample_tokens(logits, SamplingParams(temperature=1.0, top_k=1))
    assert tokens.item() == 0 and conf.item() == pytest.approx(logits.softmax(-1)[0, 0, 0].item())
    gen = torch.Generator().manual_seed(0)
    draws = [sample_tokens(logits, SamplingParams(temperature=1.0), gen)[0].item() for _ in range(400)]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / 400
    assert torch.allclose(freq, logits.softmax(-1)[0, 0], atol=0.07)
    for bad in ({"temperature": -1}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_determinism_under_a_seed(eng, prompts):
    kw = dict(max_new_tokens=12, temperature=1.0, top_p=0.95, policy="dynamic", stop_ids=[])
    a = eng.generate(prompts[:3], seed=7, **kw)
    b = eng.generate(prompts[:3], seed=7, **kw)
    c = eng.generate(prompts[:3], seed=8, **kw)
    assert a.ids == b.ids and a.step_map == b.step_map and a.confidences == b.confidences
    assert a.ids != c.ids
    greedy = eng.generate(prompts[0], max_new_tokens=12, stop_ids=[])
    assert eng.generate(prompts[0], max_new_tokens=12, stop_ids=[]).ids == greedy.ids


def test_stop_ids_and_budget(eng, prompts):
    free = eng.generate(prompts[1], max_new_tokens=20, stop_ids=[])
    assert len(free.ids[0]) == 20 and free.finished == [False]
    stop = free.ids[0][9]
    first = free.ids[0].index(stop)
    out = eng.generate(prompts[1], max_new_tokens=20, stop_ids=[stop])
    assert out.ids[0] == free.ids[0][:first] and out.finished == [True]
    assert len(out.step_map[0]) == len(out.confidences[0]) == first
    assert out.steps < free.steps or first >= 16  # stopping ends decoding at the block with the stop token
    assert eng.generate(prompts[1], max_new_tokens=0).ids == [[]]
    assert len(eng.generate(prompts[1], max_new_tokens=5, stop_ids=[]).ids[0]) == 5


def test_until_and_cancellation(eng, prompts):
    calls = []
    out = eng.generate(
        prompts[:2], max_new_tokens=20, stop_ids=[], until=lambda row, ids: calls.append(row) or row == 0
    )
    assert len(out.ids[0]) <= 4 and len(out.ids[1]) == 20 and out.finished == [True, False]
    events: list[StepEvent] = []

    def cancel_after_three(event: StepEvent) -> None:
        events.append(event)
        if event.total_steps == 3:
            raise Cancelled()

    with pytest.raises(Cancelled):
        eng.generate(prompts[0], max_new_tokens=20, stop_ids=[], on_step=cancel_after_three)
    assert [e.total_steps for e in events] == [1, 2, 3]
    assert events[-1].committed == 3
    # the engine is still usable after a cancelled generation
    assert len(eng.generate(prompts[0], max_new_tokens=4, stop_ids=[]).ids[0]) == 4


def test_dice_eval_compat_ranks_by_filtered_confidence(eng, prompts):
    out = eng.generate(
        prompts[2], max_new_tokens=12, temperature=1.0, top_k=1, dice_eval_compat=True, stop_ids=[]
    )
    assert out.confidences[0] == [1.0] * 12
    # Every slot ties at 1.0, so torch.topk's tie order decides the commit order within a block.
    scores = torch.ones(1, 4)
    order = []
    for _ in range(4):
        idx = int(torch.topk(scores, 1, dim=-1).indices[0, 0])
        order.append(idx)
        scores[0, idx] = float("-inf")
    tail = len(prompts[2]) % 4
    first_full_block = out.step_map[0][4 - tail : 8 - tail]
    assert sorted(range(4), key=lambda j: first_full_block[j]) == order
    # top_k=1 sampling is argmax, but the commit order (hence the context of later slots) differs in general
    default = eng.generate(prompts[2], max_new_tokens=12, temperature=1.0, top_k=1, stop_ids=[])
    assert all(c < 1.0 for c in default.confidences[0])


def test_generate_rejects_bad_input(eng):
    with pytest.raises(ValueError, match="policy"):
        eng.generate([1, 2, 3], max_new_tokens=4, policy="greedy")
    with pytest.raises(ValueError, match="empty"):
        eng.generate([], max_new_tokens=4)
    with pytest.raises(ValueError, match="at least one token"):
        eng.generate([[1, 2], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="token ids"):
        eng.generate([1, 10**6], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        eng.generate([1, 2], max_new_tokens=10**6)
    with pytest.raises(ValueError, match="steps_per_block"):
        eng.generate([1, 2], max_new_tokens=4, steps_per_block=-1)


def test_load_engine_resolution(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("DICE_MODEL", str(tiny_ckpt))
    eng = load_engine(None, device="cpu")
    assert eng.path == tiny_ckpt and eng.name == "dice-tiny" and eng.device.type == "cpu"
    assert eng.dtype == torch.float32 and eng.mask_id == eng.tokenizer.mask_id
    monkeypatch.delenv("DICE_MODEL")
    monkeypatch.setattr(engine.locate, "EMBEDDED_MODEL", tmp_path / "models" / "dice-tiny")
    with pytest.raises(CheckpointError, match=r"models/dice-tiny is missing"):
        load_engine(None)
    with pytest.raises(CheckpointError, match="not found"):
        load_engine(tmp_path / "nope")
    bf16 = load_engine(tiny_ckpt, device="cpu", dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    assert len(bf16.generate([5, 6, 7], max_new_tokens=4, stop_ids=[]).ids[0]) == 4


def test_infill_and_program_generation(eng):
    prefix = "import torch\nfrom torch.utils.cpp_extension import load_inline\n\n"
    suffix = 'relu_cpp_source = (\n    "torch::Tensor relu_cuda(torch::Tensor x);"\n)\n'
    done = eng.infill(prefix, suffix, max_new_tokens=24, n=2)
    assert len(done) == 2 and done[0] == done[1]  # greedy: identical samples
    c = done[0]
    assert len(c.token_ids) == len(c.step_map) <= 24 and isinstance(c.text, str)
    assert "relu_cpp_source = (" not in c.text
    sampled = eng.infill(prefix, suffix, max_new_tokens=8, n=3, temperature=1.0, seed=1)
    assert len({tuple(s.token_ids) for s in sampled}) > 1
    programs = eng.generate_program("class Model:\n    pass\n", n=1, max_new_tokens=8, stop_ids=[])
    assert len(programs) == 1 and len(programs[0].token_ids) == 8
    assert programs[0].text == eng.tokenizer.decode(programs[0].token_ids)
    assert 0.0 < programs[0].confidence < 1.0
