"""`dice cuke build` end to end on the CPU, the validator stubbed at its process boundary (the pool): what is
kept, held out, deduplicated and written, the report and card, and a killed build resuming from its cache."""

from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path

import pytest

from dice.validator.verdict import Verdict
from training.cuke.build import TASK_FILES, BuildConfig, build

REF = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {op}_input):
        {op}_output = torch.{op}({op}_input)
        return {op}_output

{op}_batch = 16
{op}_features = 1024

def get_inputs():
    {op}_x = torch.randn({op}_batch, {op}_features)
    return [{op}_x]

def get_init_inputs():
    return []
"""

NEW = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# STUB {verdict}
cuda_source = """
__global__ void {op}_kernel(const float* x, float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{ y[i] = {expr}; }}
}}
"""

cpp_source = "torch::Tensor {op}_cuda(torch::Tensor x);"
ext = load_inline(name="{op}_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["{op}_cuda"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.{op}_cuda(x)
'''

OPS = ["relu", "sigmoid", "tanh", "exp", "abs", "neg", "sqrt", "square"]


class StubPool:
    """The pool's interface (``submit_kernelbench``); the verdict is the candidate's ``# STUB`` line."""

    workers = 2

    def __init__(self, fail: bool = False, hang: bool = False) -> None:
        self.calls, self.fail, self.hang = 0, fail, hang

    def submit_kernelbench(
        self, ref_src, cand_src, *, strict=False, timing=True, not_run=None, stop_below=None
    ):
        if self.fail:
            raise AssertionError("a resumed build validated again")
        self.calls += 1
        self.stop_below = stop_below
        words = re.search(r"# STUB (.*)", cand_src).group(1).split()
        if words[0] == "slow":  # a validation that has not finished when the build's time budget ends
            if self.hang:
                return concurrent.futures.Future()
            words = words[1:]
        if words[0] == "correct":
            s = float(words[1])
            v = Verdict("correct", True, True, speedup=s, ref_ms=1.0, new_ms=1 / s)
            if stop_below is not None and s < stop_below:  # the validator's early stop of timing
                v.flags.append("timing_stopped_early")
        elif words[0] == "rejected":
            v = Verdict("rejected", True, False, message=f"rejected by guard {words[1]}: stub")
        else:
            v = Verdict(words[0], words[0] != "compile_error", False, message="stub")
        f = concurrent.futures.Future()
        f.set_result(v)
        return f

    def close(self) -> None:
        pass


def _pair(i, op, verdict, expr="x[i]", problem=True):
    rec = {
        "id": f"p{i}",
        "pytorch_code": REF.format(op=op),
        "cuda_code": NEW.format(op=op, verdict=verdict, expr=expr),
        "kb_version": "current",
    }
    if problem:
        rec |= {"level": 1, "problem_id": OPS.index(op) + 1}
    return rec


@pytest.fixture
def sources(tmp_path):
    pairs = [
        _pair(0, "relu", "correct 3.0", "fmaxf(x[i], 0.f)"),
        _pair(1, "relu", "correct 3.0", "fmaxf(x[i], 0.f)") | {"id": "p1-copy"},  # exact duplicate
        _pair(2, "sigmoid", "correct 1.3"),  # correct, too slow
        _pair(3, "tanh", "incorrect"),
        _pair(4, "exp", "rejected monkey_patch"),
        _pair(5, "abs", "correct 2.5", "fabsf(x[i])"),
        _pair(6, "neg", "correct 4.0", "-x[i]"),
        _pair(7, "sqrt", "compile_error"),
        _pair(8, "square", "correct 2.2", "x[i] * x[i]"),
    ]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    probs = tmp_path / "problems.jsonl"
    rows = [
        {"level": 1, "problem_id": i + 1, "name": f"{i}_{op}.py", "code": REF.format(op=op)}
        for i, op in enumerate(OPS)
    ]
    # twins: the same reference under another key (KernelBench has such near-identical problems); whichever
    # twin is held out, the other must not become a training task
    rows += [r | {"problem_id": r["problem_id"] + 100} for r in rows]
    probs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = tmp_path / "corpus"
    for repo in ("repoA", "repoB", "repoC"):
        (corpus / repo).mkdir(parents=True)
        (corpus / repo / "k.cu").write_text(
            "__global__ void scale(float* y, const float* x, float a, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n) {\n        y[i] = a * x[i];\n    }\n}\n"
        )
    return [src, probs, corpus]


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_build_keeps_correct_and_fast_pairs_and_writes_every_file(tmp_path, sources):
    out = tmp_path / "out"
    cfg = BuildConfig(sources=sources[:2], out=out, holdout_fraction=0.25, seed=1, shape_variants=0)
    pool = StubPool()
    rep = build(cfg, pool=pool, compile_check=lambda text: True)
    for name in (*TASK_FILES, "heldout_problems.jsonl", "report.json", "report.png", "card.md"):
        assert (out / name).is_file(), name
    from dice.validator.kbeval import load_problems

    held_problems = load_problems(out / "heldout_problems.jsonl")
    held = {f"L{p.level}P{p.problem_id}" for p in held_problems}
    assert held and len(held) == rep.settings["heldout_problems"]
    sft = _read(out / "sft.jsonl")
    kept_ops = {re.search(r"torch\.(\w+)\(\w+_input\)", r["prompt"]).group(1) for r in sft}
    fast = {"relu", "abs", "neg", "square"}
    held_ops = {OPS[(int(k[3:]) - 1) % 100] for k in held}
    assert kept_ops == fast - held_ops  # correct, >= 2x, not held out (nor its twin)
    assert not {r["group"].split(":")[-1] for r in sft} & held  # no held-out problem in training
    for r in sft:
        assert set(r) >= {"id", "prompt", "response", "level", "source", "speedup"} and r["speedup"] >= 2.0
        assert "<|im_start|>" not in r["prompt"] and r["response"].startswith("```python")
    for r in _read(out / "infill.jsonl"):
        assert r["prefix"] + r["middle"] + r["suffix"] == r["cuda_code"]
        assert 'cuda_source = """' in r["middle"]
    e2e = _read(out / "e2e.jsonl")
    assert e2e and not {r["pytorch_code"] for r in e2e} & {p.code for p in held_problems}
    report = json.loads((out / "report.json").read_text())
    funnel = {f["stage"]: f["count"] for f in report["funnel"]}
    assert funnel["read"] == 9 + 16 and funnel["pairs"] == 9
    assert funnel["exact_duplicates"] == (0 if "relu" in held_ops else 1)
    assert funnel["kept"] == len(sft)
    assert report["guards"] == ({} if "exp" in held_ops else {"monkey_patch": 1})
    assert "correct under the full protocol" in (out / "card.md").read_text()
    # every task file is sorted by level (BiC-RL's schedule is the file order)
    levels = [r["level"] for r in _read(out / "e2e.jsonl")]
    assert levels == sorted(levels)
    # `dice train sft --data OUT/sft.jsonl` reads the file as it is
    from training.corpus import read_examples

    examples = read_examples(out / "sft.jsonl")
    assert len(examples) == len(sft) and examples[0].prompt.startswith("<|im_start|>user")


def test_a_killed_build_resumes_from_its_verdict_cache(tmp_path, sources):
    out = tmp_path / "out"
    cfg = BuildConfig(sources=sources[:1], out=out, holdout_fraction=0, shape_variants=0)
    first = build(cfg, pool=StubPool(), compile_check=lambda text: True)
    lines = (out / "cache" / "verdicts.jsonl").read_text().splitlines()
    # cut the cache as a kill mid-write would: the last line half written
    (out / "cache" / "verdicts.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    pool = StubPool()
    second = build(cfg, pool=pool, compile_check=lambda text: True)
    assert pool.calls == 1  # only the verdict whose line was cut
    assert second.funnel["kept"] == first.funnel["kept"]
    third = build(cfg, pool=StubPool(fail=True), compile_check=lambda text: True)
    assert third.funnel["kept"] == first.funnel["kept"]


def test_a_time_budget_leaves_the_rest_pending_and_a_rerun_validates_only_them(tmp_path, sources):
    rows = _read(sources[0])
    rows[5]["cuda_code"] = rows[5]["cuda_code"].replace("# STUB correct", "# STUB slow correct")  # abs
    sources[0].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cfg = BuildConfig(sources=sources[:1], out=out, holdout_fraction=0, shape_variants=0, time_budget_s=0.3)
    first = build(cfg, pool=StubPool(hang=True), compile_check=lambda text: True)
    assert first.funnel["pending"] == 1 and sum(c["pending"] for c in first.by_source.values()) == 1
    assert first.funnel["validated"] == 7  # 9 pairs, 1 exact duplicate, 1 pending
    assert not any("fabsf" in r["response"] for r in _read(out / "sft.jsonl"))
    card = (out / "card.md").read_text()
    assert "Partial build: 1 candidates were not validated" in card
    report = json.loads((out / "report.json").read_text())
    assert report["validation"]["pairs"]["dropped"] == 1 and report["validation"]["pairs"]["finished"] == 7
    pool = StubPool()
    second = build(cfg, pool=pool, compile_check=lambda text: True)
    assert pool.calls == 1 and second.funnel["pending"] == 0 and second.funnel["validated"] == 8
    assert any("fabsf" in r["response"] for r in _read(out / "sft.jsonl"))
    assert "Partial build" not in (out / "card.md").read_text()


def test_shape_variants_are_validated_and_kept_as_samples_of_their_own(tmp_path):
    """A kept kernel re-posed at other sizes is one sample per shape (not a near duplicate of itself); a
    variant the validator finds incorrect at its shape is not kept."""
    pairs = [
        _pair(0, "relu", "correct 3.0", "fmaxf(x[i], 0.f)"),
        _pair(5, "abs", "correct 2.5", "fabsf(x[i])"),
    ]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in pairs))

    class ShapePool(StubPool):
        def submit_kernelbench(self, ref_src, cand_src, **kw):
            if "abs_batch = 32" in ref_src:  # the abs kernel fails at twice its batch
                cand_src = cand_src.replace("# STUB correct 2.5", "# STUB incorrect")
            return super().submit_kernelbench(ref_src, cand_src, **kw)

    out = tmp_path / "out"
    rep = build(
        BuildConfig(sources=[src], out=out, holdout_fraction=0, shape_variants=2),
        pool=ShapePool(),
        compile_check=lambda text: True,
    )
    assert rep.augmentation["validated"] == 4 and rep.augmentation["kept"] == 3
    # the funnel's pair rows count the source pairs; the variants have rows of their own
    assert rep.funnel["validated"] == 2 and rep.funnel["fast"] == 2 and len(rep.speedups) == 2
    assert rep.funnel["aug_validated"] == 4 and rep.funnel["aug_fast"] == 3
    assert rep.funnel["near_duplicates"] == 0 and rep.funnel["kept"] == 5
    prompts = [r["prompt"] for r in _read(out / "sft.jsonl")]
    assert len(set(prompts)) == 5
    for size in (8, 16, 32):
        assert sum(f"relu_batch = {size}\n" in p for p in prompts) == 1
    assert not any("abs_batch = 32" in p for p in prompts)


def test_cu_tasks_hold_out_by_project_and_file_before_cutting(tmp_path, sources):
    out = tmp_path / "out"
    cfg = BuildConfig(sources=[sources[2]], out=out, no_gpu=True, cu_holdout_fraction=0.34, seed=3)
    rep = build(cfg, compile_check=lambda text: True)
    train, held = _read(out / "cu_infill.jsonl"), _read(out / "cu_infill_heldout.jsonl")
    assert train and held
    held_origins = {r["origin"] for r in held}
    assert not held_origins & {r["origin"] for r in train}
    for r in train + held:
        assert r["text"].count("<MASK>") == 1
    assert "compile-only" in (out / "card.md").read_text()
    assert rep.funnel["validated"] == 0


def test_cli_refuses_without_a_gpu_unless_told_and_names_bad_records(tmp_path, sources, capsys):
    import torch

    from dice.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["cuke", "build", "--source", str(sources[0]), "--out", str(tmp_path / "o")]) == 2
    assert "--no-gpu" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"pytorch_code": 3}\n')
    code = main(["cuke", "build", "--source", str(bad), "--no-gpu", "--out", str(tmp_path / "o2")])
    assert code == 0
    report = json.loads((tmp_path / "o2" / "report.json").read_text())
    assert any("line 1" in e and "pytorch_code" in e for e in report["read_errors"])


def test_reward_check_keeps_only_tasks_whose_original_the_reward_pays(tmp_path):
    """Each file's original goes to the pool once, as the reward submits a fill (a header task in its folder,
    with its include paths and an empty compile database); a file that fails there loses its tasks, and so
    does a hole the original's compile never type-checked."""
    from dice.validator.verdict import Verdict
    from training.cuke.build import reward_check

    mask = "/* <MASK> */"
    good = "__global__ void k(float* y) {\n    y[0] = 1.f;\n" + mask + "\n}\n"
    rows = [
        {"id": "a1", "origin": "r:a.cu", "text": good, "kind": "statement"},
        {"id": "a2", "origin": "r:a.cu", "text": "#if 0\n" + good + "#endif\n", "kind": "statement"},
        {"id": "b1", "origin": "r:b.cu", "text": good, "kind": "statement"},
        {"id": "c1", "origin": "r:c.cu", "text": good, "kind": "statement", "folder": "cu_projects/r/src"}
        | {"include_paths": ["cu_projects/r/include"]},
    ]
    for row in rows:
        row["target"] = "    y[1] = 2.f;"
    for sub in ("src", "include"):
        (tmp_path / "cu_projects" / "r" / sub).mkdir(parents=True)
    texts = {"r:a.cu": "A", "r:b.cu": "B", "r:c.cu": "C"}

    class Pool:
        def __init__(self):
            self.calls = []

        def submit_cu(self, text, *, run=True, folder=None, build=None, spec_origin=None):
            self.calls.append((text, run, folder, build))
            if text == "B":
                v = Verdict("compile_error", False, False, message="nvcc: ATen/ATen.h: no such file")
            else:  # a's line 3 (0-based: a2's hole, not a1's at line 2) was not compiled
                v = Verdict("compiled", True, None, message="compiled")
                v.unchecked = (
                    [{"line": 3, "end_line": 3, "reason": "#if 0", "function": "k"}] if text == "A" else []
                )
            f = concurrent.futures.Future()
            f.set_result(v)
            return f

    pool = Pool()
    train, held, counts = reward_check(rows[:2] + rows[3:], [rows[2]], texts, tmp_path, pool)
    assert [r["id"] for r in train] == ["a1", "c1"] and held == []
    assert counts["files"] == 3 and counts["files_failed"] == 1 and counts["holes_not_checked"] == 1
    assert (
        counts["statuses"] == {"compile_error": 1, "compiled": 2} and counts["targets_not_reassembled"] == 0
    )
    assert sorted(r["id"] for r in counts["dropped_rows"]) == ["a2", "b1"]
    assert sorted(c[0] for c in pool.calls) == ["A", "B", "C"] and not any(c[1] for c in pool.calls)
    c_call = next(c for c in pool.calls if c[0] == "C")
    assert c_call[2] == str(tmp_path / "cu_projects/r/src")
    assert c_call[3].include_paths == (str(tmp_path / "cu_projects/r/include"),)
    assert json.loads(Path(c_call[3].compile_commands).read_text()) == []


def test_a_teacher_is_asked_even_when_no_source_pair_reaches_validation(tmp_path, sources):
    """The layer blocks' kernels come from the teacher alone: a build whose sources hold only references
    still asks it, validates what it proposes and keeps the correct, fast ones (GPU mode, stubbed pool)."""

    class StubTeacher:
        name = "stub"

        def __init__(self):
            self.asked = 0

        def propose(self, refs, samples):
            self.asked += len(refs)
            program = NEW.format(op="relu", verdict="correct 2.5", expr="x[i]")
            return [[program] + [None] * (samples - 1) for _ in refs]

    teacher = StubTeacher()
    out = tmp_path / "out"
    cfg = BuildConfig(sources=[sources[1]], out=out, holdout_fraction=0, shape_variants=0, teacher_samples=2)
    rep = build(cfg, pool=StubPool(), teacher=teacher, compile_check=lambda text: True)
    blocks = rep.augmentation["layer_blocks"]["references"]
    assert teacher.asked == blocks > 0
    assert rep.augmentation["validated"] == blocks and rep.augmentation["kept"] == blocks
    # one kernel for every block: a sample per block and shape, none a near duplicate of another
    assert rep.funnel["pairs"] == 0 and rep.funnel["near_duplicates"] == 0
    assert rep.funnel["kept"] == len(_read(out / "sft.jsonl")) == blocks


def test_the_card_names_a_source_folders_licence_not_a_table_row(tmp_path):
    """A SOURCE.md lists its files in a table (a ``LICENSE`` row among them) before its "Licence" section:
    the card's licence is the section's bold name, not the table row."""
    from training.cuke.build import _folder_licence

    folder = tmp_path / "pairs"
    folder.mkdir()
    (folder / "SOURCE.md").write_text(
        "# Some pairs\n\n| file | upstream | bytes |\n| --- | --- | --- |\n"
        "| `LICENSE` | `LICENSE` (same blob as on `main`) | 1143 |\n\n"
        '## Licence\n\nThe tree contains the repository\'s `LICENSE` unchanged: **MIT**, "Copyright ..."\n'
    )
    assert _folder_licence(folder / "data.jsonl") == "MIT"
    (folder / "SOURCE.md").write_text("## Licence\n\nApache-2.0 (see LICENSE).\n")
    assert _folder_licence(folder) == "Apache-2.0"
    (folder / "SOURCE.md").write_text("| `LICENSE` | x |\nReleased under the licence of its authors.\n")
    assert _folder_licence(folder) == "Released under the licence of its authors."
    (folder / "SOURCE.md").unlink()
    assert _folder_licence(folder) is None


def test_timing_stops_early_below_the_cut_off_and_the_cache_serves_only_builds_that_would_stop_too(tmp_path):
    pairs = [_pair(0, "relu", "correct 0.4"), _pair(1, "abs", "correct 3.0", "fabsf(x[i])")]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    out = tmp_path / "out"

    def run(pool, **kw):
        cfg = BuildConfig(sources=[src], out=out, holdout_fraction=0, shape_variants=0, **kw)
        return build(cfg, pool=pool, compile_check=lambda text: True)

    pool = StubPool()
    rep = run(pool)  # the default cut-off: half of --min-speedup 2.0
    assert pool.stop_below == 1.0 and rep.settings["timing_cutoff"] == 1.0
    assert rep.validation["pairs"]["timing_stopped_early"] == 1 and rep.funnel["kept"] == 1
    rows = {r["pair_id"].split(":")[-1]: r for r in _read(out / "cache" / "verdicts.jsonl")}
    assert rows["p0"]["stopped_below"] == 1.0 and rows["p1"]["stopped_below"] is None
    assert "1 correct candidates were timed on their pilot rounds only" in (out / "card.md").read_text()
    assert run(StubPool(fail=True), timing_cutoff=1.5).funnel["validated"] == 2  # 0.4 < 1.5: it would stop
    full = StubPool()
    run(full, timing_cutoff=0)  # 0: every candidate timed in full, so the pilot's verdict does not serve
    assert full.calls == 1 and full.stop_below is None
    # now fully timed: that verdict serves any later build
    assert run(StubPool(fail=True), timing_cutoff=0.3).funnel["validated"] == 2
    out2 = tmp_path / "out2"
    out = out2
    pool = StubPool()
    run(pool, timing_cutoff=0.2)  # 0.4 >= 0.2: timed in full
    assert pool.stop_below == 0.2 and "stopped_below" in _read(out2 / "cache" / "verdicts.jsonl")[0]
    assert all(r["stopped_below"] is None for r in _read(out2 / "cache" / "verdicts.jsonl"))


def test_a_pilot_speedup_never_keeps_a_pair():
    from training.cuke.validate import Checked

    row = Checked("k", "p", "gpu", "correct", True, True, 2.5, 1.0, 0.4, None, "", stopped_below=3.0)
    assert not row.kept(2.0)
    row.stopped_below = None
    assert row.kept(2.0)


def test_claimed_order_validates_the_likeliest_keepers_first():
    from training.cuke.build import ordered
    from training.cuke.records import Pair

    def pair(i, claim=None):
        return Pair(f"p{i}", "s", "ref", "new", meta={} if claim is None else {"claimed_speedup": claim})

    pairs = [pair(0), pair(1, 1.2), pair(2, 3.0), pair(3), pair(4, 8.0), pair(5, float("nan")), pair(6, 0.5)]
    assert [p.id for p in ordered(pairs, "claimed", 2.0)] == ["p4", "p2", "p0", "p3", "p5", "p1", "p6"]
    assert [p.id for p in ordered(pairs, "file", 2.0)] == [p.id for p in pairs]
    with pytest.raises(ValueError, match="unknown order"):
        ordered(pairs, "random", 2.0)


def test_a_stopped_verdict_serves_only_a_cut_off_it_is_below():
    from training.cuke.validate import Checked, reusable

    stopped = Checked("k", "p", "gpu", "correct", True, True, 0.4, 1.0, 2.5, None, "", stopped_below=1.0)
    assert reusable(stopped, 1.0) and reusable(stopped, 0.5)
    assert not reusable(stopped, 0.3) and not reusable(stopped, None)
    full = Checked("k", "p", "gpu", "correct", True, True, 0.4, 1.0, 2.5, None, "")
    assert reusable(full, None) and reusable(full, 0.3)


def test_a_speedup_timed_on_another_gpu_is_not_reused():
    from types import SimpleNamespace

    from training.cuke.validate import Checked, _checked, reusable

    h100 = Checked(
        "k", "p", "gpu", "correct", True, True, 3.0, 1.0, 0.3, None, "", gpu="NVIDIA H100 80GB HBM3"
    )
    assert reusable(h100, 1.0, "NVIDIA H100 80GB HBM3") and reusable(h100, 1.0, None)
    assert not reusable(h100, 1.0, "NVIDIA H200")
    unnamed = Checked("k", "p", "gpu", "correct", True, True, 3.0, 1.0, 0.3, None, "")
    assert not reusable(unnamed, 1.0, "NVIDIA H200")
    compiled = Checked("k", "p", "compile", "compiled", True, None, None, None, None, None, "")
    assert reusable(compiled, None, "NVIDIA H200")
    log = "correctness: ...\ndevice: NVIDIA H200; 3 warm-up, 100 trials, L2 flushed; 3 sets\n"
    v = SimpleNamespace(status="correct", compiled=True, correct=True, speedup=2.0, ref_ms=1, new_ms=0.5)
    assert (
        _checked(_pair_obj(), "k", "gpu", SimpleNamespace(**vars(v), message="", log=log)).gpu
        == "NVIDIA H200"
    )


def _pair_obj():
    from training.cuke.records import Pair

    return Pair("p", "s", "ref", "new")
