"""The embedded model's real-code corpus (training.embedded): the split by project and file, deduplication
against the held-out side, line-aligned holes windowed as the assistant windows them, and `dice train corpus`
on small synthetic corpora (plus one run on a subset of ../shared/data/cuda-corpus when it is there)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from dice.cli import main
from dice.cuda_source import trim_context
from training.cuke.dedup import jaccard, normalize_code, shingles
from training.cuke.records import CuFile
from training.embedded import (
    EmbeddedConfig,
    HoleConfig,
    SplitConfig,
    build_embedded_corpus,
    candidate_holes,
    heldout_projects,
    split_corpus,
    window,
)
from training.embedded.split import unit_hash

HELD_PROJECT = "acme/held"
LIB = "acme/lib"


def _kernel(rng: random.Random, name: str, statements: int = 14) -> str:
    """A kernel of distinct random statements (random names: two kernels share few shingles), with a loop,
    a condition and a helper device function."""
    names = [f"v{rng.randrange(10**8)}" for _ in range(statements)]
    body = [f"    float {names[0]} = in[i] * {rng.random():.5f}f;"]
    for k in range(1, statements):
        body.append(f"    float {names[k]} = {names[k - 1]} * {rng.random():.5f}f + in[(i + {k}) % n];")
    loop = rng.choice(names)
    return "\n".join(
        [
            f"__device__ float h{name}(float a, float b) {{",
            f"    float t = a * {rng.random():.5f}f - b;",
            "    return t * t;",
            "}",
            "",
            f"__global__ void {name}(const float* in, float* out, int n) {{",
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;",
            "    if (i >= n) {",
            "        return;",
            "    }",
            *body,
            f"    for (int k = 0; k < {rng.randrange(2, 9)}; ++k) {{",
            f"        {loop} = h{name}({loop}, {names[-1]});",
            f"        out[(i + k) % n] += {loop};",
            "    }",
            f"    out[i] = {names[-1]} + {names[0]};",
            "}",
            "",
        ]
    )


def _file(repo: str, path: str, text: str) -> dict:
    return {"repo": repo, "commit": "0" * 40, "path": path, "license": "MIT", "text": text}


def _synthetic_corpus(folder: Path, *, lib_files: int = 40) -> dict[str, str]:
    """``folder/files.jsonl.gz``: a held-out project, a library, a renamed-variable copy of a held-out file,
    an exact copy of a library file in another repository. Returns id -> text."""
    rng = random.Random(7)
    rows = [_file(HELD_PROJECT, f"src/h{k}.cu", _kernel(rng, f"held{k}")) for k in range(3)]
    rows += [_file(LIB, f"src/k{k}.cu", _kernel(rng, f"lib{k}")) for k in range(lib_files)]
    original = rows[0]["text"]
    renamed = original.replace("float t =", "float tmp =").replace("return t * t;", "return tmp * tmp;")
    rows.append(_file("other/copy", "copy.cu", renamed))
    rows.append(_file("other/copy", "same.cu", rows[5]["text"]))  # an exact copy of a library file
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "files.jsonl.gz", "wt", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return {f"{r['repo']}:{r['path']}": r["text"] for r in rows}


def _files(texts: dict[str, str]) -> list[CuFile]:
    return [CuFile(i, i.split(":")[0], i.split(":", 1)[1], t, "MIT", "0" * 40) for i, t in texts.items()]


def _examples(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


# ------------------------------------------------------------------------------------------------ split
def test_project_and_file_split_is_seeded_and_stable(tmp_path: Path) -> None:
    texts = _synthetic_corpus(tmp_path)
    files = _files(texts)
    cfg = SplitConfig((HELD_PROJECT, "nobody/absent"), file_fraction=0.2, seed=3)
    split = split_corpus(files, cfg)
    assert split.heldout_projects == [HELD_PROJECT] and split.absent_projects == ["nobody/absent"]
    held = {f.id for f in split.heldout}
    assert {i for i in texts if i.startswith(HELD_PROJECT)} <= held
    by_file = {i for i in texts if not i.startswith(HELD_PROJECT) and unit_hash(3, i) < 0.2}
    assert held == {i for i in texts if i.startswith(HELD_PROJECT)} | by_file and by_file
    # the same files in another order split the same way; another seed splits differently
    again = split_corpus(list(reversed(files)), cfg)
    assert {f.id for f in again.heldout} == held
    assert {
        f.id for f in split_corpus(files, SplitConfig((HELD_PROJECT,), file_fraction=0.2, seed=4)).heldout
    } != held
    # extra projects: seeded picks among the others
    picked, _ = heldout_projects([HELD_PROJECT, LIB, "other/copy"], SplitConfig((HELD_PROJECT,), 1, seed=0))
    assert len(picked) == 2 and HELD_PROJECT in picked
    assert picked == heldout_projects([LIB, "other/copy", HELD_PROJECT], SplitConfig((HELD_PROJECT,), 1))[0]


def test_near_and_exact_duplicates_of_heldout_files_are_dropped(tmp_path: Path) -> None:
    texts = _synthetic_corpus(tmp_path)
    held_text = texts[f"{HELD_PROJECT}:src/h0.cu"]
    copy_text = texts["other/copy:copy.cu"]
    assert copy_text != held_text
    similarity = jaccard(shingles(normalize_code(copy_text)), shingles(normalize_code(held_text)))
    assert 0.8 <= similarity < 1.0  # a renamed variable: a near duplicate, not an exact one
    reference = ("realproj:x/k.cu", texts[f"{LIB}:src/k9.cu"] + "\n// a comment the copy lacks\n")
    split = split_corpus(_files(texts), SplitConfig((HELD_PROJECT,), file_fraction=0.0), [reference])
    dropped = {d.id: d for d in split.dropped}
    assert dropped["other/copy:copy.cu"].reason == "near"
    assert dropped["other/copy:copy.cu"].match == f"{HELD_PROJECT}:src/h0.cu"
    assert dropped["other/copy:same.cu"].reason == "exact-in-train"  # the library's copy is kept once
    assert dropped["other/copy:same.cu"].match == f"{LIB}:src/k2.cu"
    assert dropped[f"{LIB}:src/k9.cu"].reason == "exact" and dropped[f"{LIB}:src/k9.cu"].match == reference[0]
    assert {f.id for f in split.train}.isdisjoint(dropped) and f"{LIB}:src/k2.cu" in {
        f.id for f in split.train
    }
    assert split.counts()["dropped_as_duplicate"] == 3


# ------------------------------------------------------------------------------------------------ holes
def test_statement_holes_are_line_aligned_and_expressions_are_byte_cuts() -> None:
    text = _kernel(random.Random(1), "k")
    data = text.encode()
    holes = candidate_holes(data, 1600)
    assert holes is not None and {h.kind for h in holes} == {
        "statement",
        "statements",
        "expression",
        "loop_body",
        "kernel_body",
    }
    for hole in holes:
        prefix, middle, suffix = window(data, hole, 10**6)
        assert prefix + middle + suffix == text
        if hole.kind == "expression":
            assert not hole.line_aligned and "\n" not in middle
        else:
            assert hole.line_aligned, hole
            assert prefix.endswith("\n") and middle.endswith("\n") and middle.strip()
            assert middle.startswith("    ")  # the indentation belongs to the middle
    assert candidate_holes(b"#pragma once\n#define N 4\n", 1600) is None  # no function body


def test_window_respects_the_budget_and_keeps_the_function_when_it_fits() -> None:
    rng = random.Random(2)
    filler = "".join(_kernel(rng, f"f{k}") + "\n" for k in range(12))
    target = _kernel(rng, "target")
    text = filler + target + filler
    data = text.encode()
    holes = [
        h for h in candidate_holes(data, 1600) or [] if data[h.fn_start : h.fn_end].find(b"target(") >= 0
    ]
    assert holes
    for hole in holes:
        fn_bytes = 2 * (hole.start - hole.fn_start) + (hole.fn_end - hole.end)
        for budget in (300, 1500, 3000, 6000):
            prefix, middle, suffix = window(data, hole, budget)
            assert 2 * len(prefix.encode()) + len(suffix.encode()) <= budget
            assert (prefix + middle + suffix) in text
            assert prefix.endswith("\n") or not prefix or not hole.line_aligned
            if fn_bytes <= budget:  # the enclosing function is whole
                assert data[hole.fn_start : hole.fn_end].decode() in prefix + middle + suffix


def test_trim_context_properties() -> None:
    """The window rule (dice.cuda_source.window.trim_context, the assistant's and training's one copy):
    whole when it fits, else within the budget, a tail of the text before and a head of the text after,
    cut at a line boundary where the kept part holds one, and the enclosing function kept whole when it
    fits."""
    import dice.assistant.prompting as prompting

    assert prompting.trim_context is trim_context  # the assistant uses this very function
    rng = random.Random(0)
    for _ in range(400):
        lines = [("x" * rng.randrange(0, 60) + rng.choice(["", "é"])) for _ in range(rng.randrange(1, 40))]
        data = "\n".join(lines).encode()
        cut = data.find(b"\n", rng.randrange(0, len(data) + 1)) + 1 or len(data)  # a hole at a line start
        before, after = data[:cut], data[cut:]
        keep_before, keep_after = rng.randrange(0, len(before) + 1), rng.randrange(0, len(after) + 1)
        budget, weight = rng.randrange(0, 3 * len(data) + 10), rng.choice([1, 2])
        b, a = trim_context(before, after, budget, keep_before, keep_after, weight)
        assert before.endswith(b) and after.startswith(a)
        if weight * len(before) + len(after) <= budget:
            assert (b, a) == (before, after)
            continue
        assert weight * len(b) + len(a) <= budget
        b.decode(), a.decode()  # whole characters
        if weight * (len(before) - keep_before) + keep_after <= budget:  # the function fits: kept whole
            assert len(b) >= len(before) - keep_before - before[keep_before:].find(b"\n") - 1 or (
                b"\n" not in before[keep_before:]
            )
            assert a.startswith(after[: after.rfind(b"\n", 0, keep_after) + 1])


def _check_examples(examples: list[dict], texts: dict[str, str], window_range: tuple[int, int]) -> None:
    for ex in examples:
        meta = ex["meta"]
        assert ex["task"] == "cu_infill" and ex["source"] == f"cuda-corpus:{meta['kind']}"
        assert ex["group"] == f"{meta['repo']}:{meta['path']}"
        assert meta["prefix"] + meta["middle"] + meta["suffix"] in texts[ex["group"]]
        assert window_range[0] <= meta["budget"] <= window_range[1]
        assert 2 * len(meta["prefix"].encode()) + len(meta["suffix"].encode()) <= meta["budget"]
        assert ex["response"].startswith(meta["middle"]) and ex["prompt"].endswith(meta["prefix"])
        if meta["line_aligned"]:
            assert meta["prefix"].endswith("\n") and meta["middle"].endswith("\n")


def test_build_keeps_every_heldout_file_out_of_training(tmp_path: Path) -> None:
    texts = _synthetic_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    cfg = EmbeddedConfig(
        out,
        kernelbench=False,
        cuda_corpus=tmp_path / "corpus",
        split=SplitConfig((HELD_PROJECT,), file_fraction=0.2),
        holes=HoleConfig(window=(400, 2000)),
        workers=1,
    )
    stats = build_embedded_corpus(cfg)
    split = json.loads((out / "split.json").read_text())
    held = {f["id"] for f in split["heldout_files"]}
    dropped = {d["id"] for d in split["dropped_as_duplicate"]}
    contaminated = {d["id"] for d in split["dropped_as_duplicate"] if d["reason"] != "exact-in-train"}
    assert split["heldout_projects"] == [HELD_PROJECT] and "other/copy:copy.cu" in contaminated
    train, heldout = _examples(out / "train.jsonl.gz"), _examples(out / "heldout.jsonl.gz")
    assert train and heldout and {e["group"] for e in heldout} <= held
    assert not {e["group"] for e in train} & (held | dropped)
    _check_examples(train + heldout, texts, (400, 2000))
    train_blob = gzip.decompress((out / "train.jsonl.gz").read_bytes()).decode()
    tokenizer_text = (out / "tokenizer_text.txt").read_text()
    for ident in held | contaminated:  # every kernel's random names are its own
        names = {w for w in texts[ident].replace("(", " ").split() if w.startswith("v") and w[1:2].isdigit()}
        assert names and not any(n in train_blob or n in tokenizer_text for n in names), ident
    assert texts[f"{LIB}:src/k2.cu"] in tokenizer_text  # kept training files are tokenizer text
    assert stats["train"]["cu_infill"] == len(train) and stats["heldout"]["cu_infill"] == len(heldout)
    assert stats["cuda_corpus"]["split"]["dropped_as_duplicate"] == len(dropped)
    # each side's files, in the corpus schema, for the stages that cut tasks from files (dice cuke build)
    from training.cuke.readers import read_source

    sides = ("train_files", "heldout_files")
    side_files = {name: list(read_source(out / f"{name}.jsonl.gz")) for name in sides}
    assert {f.id for f in side_files["heldout_files"]} == held
    assert {f.id for f in side_files["train_files"]} == set(texts) - held - dropped
    assert all(f.text == texts[f.id] for fs in side_files.values() for f in fs)
    sources = (out / "sources.md").read_text()
    assert f"| {HELD_PROJECT} (held-out project) |" in sources and f"| {LIB} |" in sources
    # the same build again (here over two processes) writes the same examples
    again = build_embedded_corpus(
        EmbeddedConfig(**{**cfg.__dict__, "out_dir": tmp_path / "again", "workers": 2})
    )
    assert _examples(tmp_path / "again" / "train.jsonl.gz") == train and again["train"] == stats["train"]


def test_cli_builds_without_shared_data_and_names_a_missing_path(tmp_path: Path, capsys) -> None:
    _synthetic_corpus(tmp_path / "corpus")
    argv = [
        "train",
        "corpus",
        "--no-kernelbench",
        "--cuda-corpus",
        str(tmp_path / "corpus" / "files.jsonl.gz"),
    ]
    argv += ["--out", str(tmp_path / "out"), "--holdout-projects", HELD_PROJECT, "--window-bytes", "500,900"]
    assert main([*argv, "--heldout-file-fraction", "0.1", "--holes-per-kb", "2", "--workers", "1"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["cuda_corpus"]["heldout_projects"] == [HELD_PROJECT] and stats["train"]["cu_infill"] > 0
    for ex in _examples(tmp_path / "out" / "train.jsonl.gz"):
        assert 500 <= ex["meta"]["budget"] <= 900
    assert (
        main(["train", "corpus", "--no-kernelbench", "--cuda-corpus", str(tmp_path / "nope"), "--out", "x"])
        != 0
    )
    assert "--cuda-corpus" in capsys.readouterr().err
    assert main(["train", "corpus", "--out", str(tmp_path / "y")]) != 0  # KernelBench needs --data-dir
    assert "--data-dir" in capsys.readouterr().err


def test_builder_on_a_subset_of_the_real_corpus(tmp_path: Path, shared_data: Path) -> None:
    shared = shared_data
    corpus = shared / "cuda-corpus" / "files.jsonl.gz"
    if not corpus.is_file():
        pytest.skip("../shared/data/cuda-corpus is absent")
    with gzip.open(corpus, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for n, line in enumerate(fh) if n % 19 == 0]  # ~200 files, every project
    (tmp_path / "c").mkdir()
    with gzip.open(tmp_path / "c" / "files.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    realproj = shared / "realproj"
    cfg = EmbeddedConfig(
        tmp_path / "out",
        kernelbench=False,
        cuda_corpus=tmp_path / "c",
        reference_trees=(realproj,) if realproj.is_dir() else (),
        workers=1,
    )
    stats = build_embedded_corpus(cfg)
    texts = {f"{r['repo']}:{r['path']}": r["text"] for r in rows}
    train, heldout = (
        _examples(tmp_path / "out" / "train.jsonl.gz"),
        _examples(tmp_path / "out" / "heldout.jsonl.gz"),
    )
    assert len(train) > 500 and len(heldout) > 50
    _check_examples(train + heldout, texts, (1500, 6000))
    held_projects = {"ggml-org/ggml", "NVIDIA/CUDALibrarySamples"}
    assert not {e["meta"]["repo"] for e in train} & held_projects
    assert {e["meta"]["repo"] for e in heldout} & held_projects
    kinds = stats["cuda_corpus"]["examples"]["train"]
    assert set(kinds) == {"statement", "statements", "expression", "loop_body", "kernel_body"}
    assert kinds["statement"] == max(kinds.values())
