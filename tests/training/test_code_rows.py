"""Plain code as language-model rows beside the infill examples (``dice train pack --code-files``)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tokenizer import load_tokenizer
from training.corpus import Example, PackedRows, code_sequences, read_code_texts, tokenize_and_pack

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "engine" / "models" / "dice-tiny"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


def kernel_file(n_kernels: int) -> str:
    parts = ["#include <cuda_runtime.h>\n\n"]
    for k in range(n_kernels):
        parts.append(
            f"__global__ void scale_{k}(const float* __restrict__ x, float* y, int n) {{\n"
            "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (i < n) y[i] = {k}.5f * x[i] + {k};\n"
            "}\n\n"
        )
    return "".join(parts)


def test_a_file_becomes_chunks_that_fit_and_together_are_the_file(tok) -> None:
    text = kernel_file(40)
    seq_len, block = 256, 4
    seqs, stats = code_sequences([text], tok, seq_len=seq_len, block_size=block)
    assert stats["code_chunks"] == len(seqs) > 3 and stats["code_dropped"] == 0
    tail = [tok.im_end_id, *tok.encode("\n")]
    pieces = []
    for ids, loss in seqs:
        assert len(ids) <= seq_len and len(ids) % block == 0
        assert all(loss)  # no prompt: every token is trained on
        body = ids[: ids.index(tok.im_end_id)]
        assert ids[len(body) : len(body) + len(tail)] == tail
        assert set(ids[len(body) + len(tail) :]) <= {tok.eos_id}
        pieces.append(tok.decode(body))
    assert "".join(pieces) == text  # cut at line ends, in order, nothing lost
    assert stats["code_tokens"] == sum(len(tok.encode(p)) for p in pieces)


def test_a_line_longer_than_a_row_is_left_out_and_counted(tok) -> None:
    text = "int a = 0;\n" + "x" * 5000 + "\nint b = 1;\n"
    seqs, stats = code_sequences([text], tok, seq_len=128, block_size=4)
    assert stats["code_dropped"] == 1
    decoded = "".join(tok.decode(ids[: ids.index(tok.im_end_id)]) for ids, _ in seqs)
    assert decoded == "int a = 0;\nint b = 1;\n"


def test_packed_rows_hold_examples_and_code(tok) -> None:
    ex = Example("e0", "g", "cu_infill", "test", prompt="fill: int i = ", response="0;\n")
    rows, stats = tokenize_and_pack([ex], tok, seq_len=512, block_size=4, code_texts=[kernel_file(12)])
    assert stats["examples"] == 1 and stats["code_chunks"] >= 1
    prompt_len = len(tok.encode(ex.prompt))
    padding = len(rows) * 512 - stats["tokens"]  # the rows' tails
    # the example's prompt is the only span not trained on, besides the rows' tails
    assert int((~rows.loss_mask).sum()) == prompt_len + padding
    assert stats["answer_tokens"] == int(rows.loss_mask.sum())


def test_read_code_texts_needs_a_text_field(tmp_path: Path) -> None:
    good = tmp_path / "files.jsonl.gz"
    with gzip.open(good, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "a", "text": "int x;\n"}) + "\n\n")
        fh.write(json.dumps({"id": "b", "text": "int y;\n"}) + "\n")
    assert read_code_texts(good) == ["int x;\n", "int y;\n"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "body": "int x;"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a file record needs a 'text' string"):
        read_code_texts(bad)


def test_cli_pack_with_code_files(tmp_path: Path, tok) -> None:
    examples = tmp_path / "train.jsonl"
    ex = Example("e0", "g", "cu_infill", "test", prompt="fill: int i = ", response="0;\n")
    examples.write_text(ex.to_json() + "\n")
    files = tmp_path / "train_files.jsonl"
    files.write_text(json.dumps({"id": "k", "text": kernel_file(20)}) + "\n")
    out = tmp_path / "rows.npz"
    cmd = [sys.executable, "-m", "dice", "train", "pack", "--examples", str(examples)]
    cmd += ["--tokenizer", str(TOKENIZER), "--seq-len", "256", "--out", str(out)]
    done = subprocess.run([*cmd, "--code-files", str(files)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["code_texts"] == 1 and stats["code_chunks"] >= 2
    rows = PackedRows.load(out)
    assert int(rows.loss_mask.sum()) == stats["answer_tokens"]
    files.write_text('{"id": "k"}\n')
    done = subprocess.run([*cmd, "--code-files", str(files)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and "needs a 'text' string" in done.stderr
    assert "Traceback" not in done.stderr


def test_empty_and_blank_texts_give_no_rows(tok) -> None:
    seqs, stats = code_sequences(["", "\n\n  \n"], tok, seq_len=128, block_size=4)
    assert seqs == [] and stats["code_chunks"] == 0 and stats["code_texts"] == 2
