"""Corpus pieces: CUDA strings, infill cuts, the split by problem, chat sequences and packing."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from training.corpus import (
    ChatSpecials,
    CorpusConfig,
    Example,
    PackedRows,
    build_examples,
    chat_sequence,
    cuda_strings,
    infill_cuts,
    pack,
    read_all,
    read_examples,
    split_groups,
)

PROGRAM = '''import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int j = i; j < n; j += gridDim.x * blockDim.x) {
        float v = x[j];
        y[j] = v > 0.0f ? v : 0.0f;
    }
}
torch::Tensor relu(torch::Tensor x) { return x; }
"""
doc = """a docstring that mentions no kernel"""
cpp = "torch::Tensor relu(torch::Tensor x);"
'''


def test_cuda_strings_finds_device_code_with_exact_span() -> None:
    (cs,) = cuda_strings(PROGRAM)
    assert "__global__" in cs.text and PROGRAM[cs.start : cs.end] == cs.text
    assert cuda_strings("not python (") == []


def test_infill_cuts_cover_statements_loops_and_kernel_bodies() -> None:
    text = cuda_strings(PROGRAM)[0].text
    cuts = infill_cuts(text)
    kinds = {c.kind for c in cuts}
    assert {"statement", "statements", "loop_body", "kernel_body"} <= kinds
    middles: dict[str, list[str]] = {}
    for c in cuts:
        middles.setdefault(c.kind, []).append(text[c.start : c.end])
    assert "int i = blockIdx.x * blockDim.x + threadIdx.x;" in middles["statement"]
    assert any(m.startswith("float v = x[j];") and m.endswith("0.0f;") for m in middles["loop_body"])
    (body,) = middles["kernel_body"]
    assert body.startswith("int i =") and body.endswith("}")  # inner text of the braces, stripped
    for c in cuts:  # a cut never splits a token: the middle is whole statements
        assert text[c.start : c.end].strip() == text[c.start : c.end]


def test_split_is_by_problem_and_keeps_pr67_eval_problems_out() -> None:
    groups = [f"L{lv}P{i}" for lv in (1, 2) for i in range(1, 101)]
    held = split_groups(groups, 0.08, seed=0)
    assert {"L1P7", "L2P3", "L2P81"} <= held  # KernelBench PR-67's eval problems
    assert 20 < len(held) < 60
    assert held == split_groups(groups, 0.08, seed=0)


def test_chat_sequence_pads_to_the_block_with_eos_and_trains_on_the_answer() -> None:
    sp = ChatSpecials(eos_id=0, im_end_id=2)
    ids, loss = chat_sequence([5, 6, 7], [8, 9], sp, 4, [10])
    assert ids == [5, 6, 7, 8, 9, 2, 10, 0]  # prompt, answer, <|im_end|>, "\n", eos padding
    assert loss == [False] * 3 + [True] * 5
    assert len(chat_sequence([1], [2, 3], sp, 4, [10])[0]) == 8  # [1,2,3,2,10] -> padded to 8


def test_pack_aligns_documents_to_blocks_and_drops_long_ones() -> None:
    rng = random.Random(0)
    seqs = []
    for _ in range(30):
        n = 4 * rng.randint(1, 6)
        seqs.append(([rng.randint(1, 50) for _ in range(n)], [i % 2 == 0 for i in range(n)]))
    seqs.append(([1] * 40, [True] * 40))  # longer than a row
    rows, dropped = pack(seqs, 32, 4, pad_id=0)
    assert dropped == 1
    kept_tokens = sum(len(s[0]) for s in seqs[:-1])
    assert int((rows.position_ids == 0).sum()) >= 30
    assert kept_tokens <= rows.input_ids.numel() < kept_tokens + 32 * 3  # tightly packed
    for r in range(len(rows)):
        starts = torch.nonzero(rows.position_ids[r] == 0).flatten()
        assert all(int(s) % 4 == 0 for s in starts)  # every document starts on a block boundary
        assert torch.equal(rows.doc_ids[r], torch.cumsum((rows.position_ids[r] == 0).long(), 0) - 1)
    assert int(rows.loss_mask.sum()) == sum(sum(s[1]) for s in seqs[:-1])


def test_rows_round_trip_through_npz_and_safetensors(tmp_path: Path) -> None:
    rows, _ = pack([([3] * 8, [True] * 8), ([4] * 4, [False] * 4)], 16, 4, pad_id=0)
    for name in ("rows.npz", "rows.safetensors"):
        rows.save(tmp_path / name)
        back = PackedRows.load(tmp_path / name)
        for field in ("input_ids", "position_ids", "doc_ids", "loss_mask"):
            assert torch.equal(getattr(back, field), getattr(rows, field)), (name, field)


def test_corpus_from_shared_data_is_rendered_with_the_engine_templates(
    shared_data: Path, tmp_path: Path
) -> None:
    from engine.prompts import RESPONSE_CODE_FENCE

    solutions = [s for s in read_all(shared_data) if s.group in {"L1P1", "L1P19", "L2P12"}]
    examples = build_examples(solutions, CorpusConfig(shared_data, tmp_path, cu_variants=4))
    tasks = {e.task for e in examples}
    assert tasks == {"kernelbench", "dice_infill", "cu_infill"}
    for e in examples:
        assert e.prompt.startswith("<|im_start|>user\n") and "<|im_start|>assistant\n" in e.prompt
        if e.task == "cu_infill":
            m = e.meta
            assert e.prompt.endswith(RESPONSE_CODE_FENCE + m["prefix"])
            assert e.response.startswith(m["middle"]) and m["middle"].strip()
        if e.task in ("kernelbench", "dice_infill"):
            assert e.response.rstrip().endswith("```")
    path = tmp_path / "x.jsonl.gz"
    import gzip

    with gzip.open(path, "wt") as fh:
        fh.write(examples[0].to_json() + "\n")
    assert read_examples(path) == [examples[0]]
    assert isinstance(examples[0], Example)
