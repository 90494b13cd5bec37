"""Tokenizer loading: the tiny checkpoint's tokenizer.json and the SDAR release's vocab.json + merges.txt."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.errors import CheckpointError
from engine.tokenizer import load_tokenizer


def test_tiny_tokenizer_round_trips_and_has_the_special_ids(tiny_ckpt):
    tok = load_tokenizer(tiny_ckpt)
    text = "__global__ void relu(const float* x, float* y, int n) {\n    int i = threadIdx.x;\n}\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # trained merges, not bytes
    for name, value in (
        ("<|endoftext|>", tok.eos_id),
        ("<|im_start|>", tok.im_start_id),
        ("<|im_end|>", tok.im_end_id),
        ("<|MASK|>", tok.mask_id),
    ):
        assert tok.token_to_id(name) == value
        assert tok.encode(f"a{name}b")[1:-1] == [value]
    assert tok.pad_id == tok.eos_id
    assert tok.stop_ids() == [tok.im_end_id, tok.eos_id]
    config = json.loads((tiny_ckpt / "config.json").read_text())
    assert config["mask_token_id"] == tok.mask_id and config["vocab_size"] >= tok.vocab_size


def test_sdar_tokenizer_from_vocab_and_merges(shared_data):
    """Ids transformers gives for the SDAR release (recorded in shared/data/sdar-tokenizer/SOURCE.md)."""
    tok = load_tokenizer(shared_data / "sdar-tokenizer")
    assert tok.vocab_size == 151670
    assert (tok.eos_id, tok.pad_id, tok.mask_id, tok.im_start_id, tok.im_end_id) == (
        151643,
        151643,
        151669,
        151644,
        151645,
    )
    assert tok.encode("Hello <|MASK|><|MASK|> world<|im_end|>\n") == [
        9707,
        220,
        151669,
        151669,
        1879,
        151645,
        198,
    ]
    assert tok.encode("<MASK>") == [33274, 7384, 29]
    chat = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(chat) == [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


def test_vocab_merges_build_equals_tokenizer_json_on_kernelbench(shared_data):
    from_files = load_tokenizer(shared_data / "sdar-tokenizer")
    from_json = load_tokenizer(shared_data / "sdar-tokenizer" / "derived-not-upstream", mask_id=151669)
    problems = [json.loads(line)["code"] for line in (shared_data / "kernelbench" / "problems.jsonl").open()]
    problems = problems[::9]  # a spread of levels, kept quick
    a, b = from_files.encode_batch(problems), from_json.encode_batch(problems)
    assert a == b
    assert [from_files.decode(ids) for ids in a] == problems


def test_missing_tokenizer_is_a_clear_error(tiny_ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer"):
        load_tokenizer(tmp_path)
    broken = shutil.copytree(tiny_ckpt, tmp_path / "broken")
    (broken / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="cannot load"):
        load_tokenizer(broken)
