"""Identifier-scoped decoding (engine.scope): which tokens a fill may spell; the decoder keeps to them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.engine import load_engine
from engine.model_settings import read_identifier_scope
from engine.scope import LEXICON, IdentifierScope, is_word_piece
from engine.tokenizer import load_tokenizer

SRC = (
    "__global__ void scale(float* data, int count) {\n    int tid = blockIdx.x * blockDim.x + threadIdx.x;\n"
)


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("idx", True),
        (" count", True),
        ("(tid", True),
        ("_", True),
        ("$", True),
        ("f", True),  # alone, "f" is a name; after digits, a float suffix
        ("1e", False),
        ("0f", False),
        (".5f", False),
        ("0x1F", False),
        ("2u", False),
        (" += ", False),
        ("\n    ", False),
        (";", False),
        ("42", False),
        ("é", False),  # not an identifier character of C++ as a model writes it
    ],
)
def test_word_pieces_are_told_from_numbers_and_punctuation(text: str, word: bool) -> None:
    assert is_word_piece(text) is word


def _spells(tok, mask: torch.Tensor, text: str) -> bool:
    return all(bool(mask[i]) for i in tok.encode(text))


def test_the_mask_allows_the_prompts_words_and_nothing_else_that_spells_a_word(tiny_ckpt: Path) -> None:
    tok = load_tokenizer(tiny_ckpt)
    scope = IdentifierScope(tok)
    mask = scope.allowed(SRC)
    assert mask.dtype == torch.bool and mask.shape == (tok.vocab_size,)
    # the prompt's words, after the characters they follow in C++, are spelled with allowed tokens
    for text in (" count", "(data", " tid", "tid;", "threadIdx.x", "[tid]", " scale"):
        assert _spells(tok, mask, text), text
    # punctuation, numbers and the special tokens are always allowed
    for text in (" = ", ";\n", "1.0f", "0x1F", "  ", "<|im_end|>", "<|endoftext|>"):
        assert _spells(tok, mask, text), text
    # every word-spelling token outside the prompt's and the lexicon's spellings is masked
    other = scope.allowed("")
    assert int(mask.sum()) > int(other.sum())
    banned = [i for i in range(tok.vocab_size) if not mask[i]]
    assert banned, "the tiny vocabulary has words this prompt does not use"
    assert all(is_word_piece(tok.decode([i])) for i in banned)
    # a word of neither the prompt nor the lexicon needs at least one masked token
    spelled_elsewhere = [w for w in ("model", "Python", "return") if w not in LEXICON]
    assert any(not _spells(tok, mask, " " + w) for w in spelled_elsewhere)


def test_spellings_are_cached_per_word(tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_tokenizer(tiny_ckpt)
    scope = IdentifierScope(tok)
    first = scope.allowed(SRC)
    calls = []
    real = tok.encode_batch
    monkeypatch.setattr(tok, "encode_batch", lambda texts: calls.append(list(texts)) or real(texts))
    assert torch.equal(scope.allowed(SRC), first)
    assert calls == []  # nothing new to encode
    scope.allowed(SRC + "float extra_name;")
    assert len(calls) == 1 and all(t.endswith("extra_name") for t in calls[0])


def test_identifier_scope_setting(tmp_path: Path) -> None:
    assert read_identifier_scope(None) == "off"
    assert read_identifier_scope(tmp_path) == "off"
    (tmp_path / "dice.json").write_text('{"infill_holes": "line"}')
    assert read_identifier_scope(tmp_path) == "off"
    (tmp_path / "dice.json").write_text('{"identifier_scope": "prompt"}')
    assert read_identifier_scope(tmp_path) == "prompt"
    (tmp_path / "dice.json").write_text('{"identifier_scope": "file"}')
    with pytest.raises(ValueError, match="identifier_scope must be one of off, prompt"):
        read_identifier_scope(tmp_path)


def test_generate_keeps_each_row_to_its_allowed_tokens(tiny_ckpt: Path) -> None:
    engine = load_engine(tiny_ckpt, device="cpu")
    tok = engine.tokenizer
    prompts = [tok.encode("int a = b;"), tok.encode("float x = y * 2;")]
    free = engine.generate(prompts, max_new_tokens=12, stop_ids=[])
    only = [sorted(set(free.ids[0]))[:1] + tok.encode(" ;"), tok.encode("x + 1")]
    allowed = torch.zeros(2, tok.vocab_size, dtype=torch.bool)
    for row, ids in enumerate(only):
        allowed[row, ids] = True
    out = engine.generate(prompts, max_new_tokens=12, stop_ids=[], allowed=allowed)
    for row, ids in enumerate(only):
        assert out.ids[row] and set(out.ids[row]) <= set(ids)
    # one (V,) mask for every row; sampling too
    one = allowed[1]
    out = engine.generate(prompts, max_new_tokens=8, stop_ids=[], allowed=one, temperature=1.0, seed=3)
    assert all(set(row) <= set(only[1]) for row in out.ids)
    with pytest.raises(ValueError, match="no token to produce"):
        engine.generate(prompts, max_new_tokens=4, allowed=torch.zeros(2, tok.vocab_size, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"allowed must be \(V,\) or \(2, V\)"):
        engine.generate(prompts, max_new_tokens=4, allowed=torch.ones(3, tok.vocab_size, dtype=torch.bool))


def test_infill_follows_the_models_setting(tiny_ckpt: Path, tmp_path: Path) -> None:
    prefix, suffix = SRC, "    data[tid] *= 2.0f;\n}\n"
    plain = load_engine(tiny_ckpt, device="cpu")
    assert plain.identifier_scope is False
    scoped_dir = tmp_path / "scoped"
    shutil.copytree(tiny_ckpt, scoped_dir)
    (scoped_dir / "dice.json").write_text(json.dumps({"identifier_scope": "prompt"}))
    scoped = load_engine(scoped_dir, device="cpu")
    assert scoped.identifier_scope is True
    from engine.infill import InfillPlan

    mask = scoped.scope_mask(InfillPlan.make(prefix, suffix).prompt_text)
    sampled = dict(n=8, temperature=1.0, seed=0, max_new_tokens=24)
    for engine, asked in ((scoped, None), (plain, True)):
        fills = engine.infill(prefix, suffix, identifier_scope=asked, **sampled)
        assert all(f.token_ids for f in fills)
        assert all(bool(mask[i]) for f in fills for i in f.token_ids)
    # unscoped, this random model's samples use masked tokens (else the test would prove nothing)
    free = plain.infill(prefix, suffix, **sampled)
    assert any(i >= len(mask) or not mask[i] for f in free for i in f.token_ids)
