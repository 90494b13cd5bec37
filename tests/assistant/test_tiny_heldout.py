"""benchmarks/tiny_heldout.py: the hole sampler, the mask line and the summary on a synthetic project, the
heldout-files set on a synthetic heldout_files.jsonl.gz + split.json (no model, no ../shared), and a two-hole
end-to-end run on realproj with the tiny random checkpoint (skipped without ../shared/data/realproj or
nvcc)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

KERNEL = """\
#include <cuda_runtime.h>

__global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
    return;
    y[0] = add(a,
               n);
    float t = x[0];  // a trailing comment
    for (int k = 0; k < n; ++k) y[k] = t;
}

int main() {
    int n = 1024;
    float *d_x = nullptr;
    cudaMalloc(&d_x, n * sizeof(float));
    return 0;
}
"""

HEADER = """\
#pragma once
__device__ inline float twice(float v) {
    const float w = v + v;
    return w;
}
"""


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("tiny_heldout", ROOT / "benchmarks" / "tiny_heldout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tiny_heldout"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _project(root: Path) -> Path:
    files = {
        "one+alpha/src/scale.cu": KERNEL,
        "one+alpha/src/twice.cuh": HEADER,
        "one+alpha/src/host.h": HEADER,  # not a file the editor fills
        "two+beta/k.cu": KERNEL.replace("scale", "scale2"),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    tus = [
        {"file": f, "directory": ".", "arguments": []} for f in ("one+alpha/src/scale.cu", "two+beta/k.cu")
    ]
    (root / "compile_commands.template.json").write_text(json.dumps(tus))
    headers = {"one+alpha/src/twice.cuh": {}, "one+alpha/src/host.h": {}}
    (root / "headers.json").write_text(json.dumps(headers))
    return root


def test_hole_lines_are_whole_single_statements(bench: Any) -> None:
    lines = KERNEL.splitlines()
    got = [lines[n].strip() for n in bench.hole_lines(KERNEL)]
    assert got == [
        "int i = blockIdx.x * blockDim.x + threadIdx.x;",
        "if (i < n) y[i] = a * x[i];",
        "int n = 1024;",
        "float *d_x = nullptr;",
        "cudaMalloc(&d_x, n * sizeof(float));",
        "return 0;",
    ]  # not: bare return, a statement over two lines, a trailing comment, a for loop


def test_mask_line_keeps_the_indentation(bench: Any) -> None:
    line = KERNEL.splitlines().index("    if (i < n) y[i] = a * x[i];")
    masked = bench.mask_line(KERNEL, line)
    assert masked.splitlines()[line] == "    /* <MASK> */"
    assert masked.splitlines()[:line] == KERNEL.splitlines()[:line]
    assert masked.splitlines()[line + 1 :] == KERNEL.splitlines()[line + 1 :]
    from dice.cuda_source import parse_document

    (mask,) = parse_document(masked).masks
    assert mask.function == "scale" and mask.budget is None


def test_sampler_is_seeded_spread_and_capped(bench: Any, tmp_path: Path) -> None:
    root = _project(tmp_path)
    files = bench.candidate_files(root)
    assert files == ["one+alpha/src/scale.cu", "one+alpha/src/twice.cuh", "two+beta/k.cu"]
    assert bench.candidate_files(root, ["BETA"]) == ["two+beta/k.cu"]
    holes = bench.sample_holes(root, files, 100, seed=0, per_file=3)
    assert holes == bench.sample_holes(root, files, 100, seed=0, per_file=3)
    per_file = {f: sum(1 for h in holes if h.file == f) for f in files}
    assert per_file == {"one+alpha/src/scale.cu": 3, "one+alpha/src/twice.cuh": 2, "two+beta/k.cu": 3}
    assert [h.project for h in holes[:2]] == ["one+alpha", "two+beta"]  # round-robin over projects
    for h in holes:
        assert (root / h.file).read_text().splitlines()[h.line].strip() == h.original
    assert len(bench.sample_holes(root, files, 4, seed=0)) == 4


def _record(bench: Any, project: str, *, checkable: bool, top: str | None, shown: str) -> dict[str, Any]:
    original = "int i = 0;"
    rec: dict[str, Any] = {
        "project": project,
        "file": f"{project}/k.cu",
        "line": 3,
        "original": original,
        "checkable": checkable,
        "not_checkable_because": None if checkable else "garbage: compiled",
    }
    if not checkable:
        return rec
    cand = lambda text, rank, greedy: {  # noqa: E731
        "rank": rank,
        "text": text,
        "greedy": greedy,
        "compiles": text.endswith(";"),
        "exact": text == original,
        "multiline": "\n" in text,
        "status": "compiled" if text.endswith(";") else "compile_error",
        "checker": "nvcc",
    }
    cands = [cand(shown, 0, top == shown)] + ([cand(top, 1, True)] if top not in (None, shown) else [])
    model_top = next((c for c in cands if c["greedy"]), None)
    rec.update(greedy_model_s=0.2, model_s=0.5, validate_s=2.0, total_s=2.6, blank=False)
    rec.update(candidates=cands, model_top=model_top, shown=cands[0], greedy_blank=model_top is None)
    rec.update(any_compiles=any(c["compiles"] for c in cands), any_exact=any(c["exact"] for c in cands))
    return rec


def test_summary_and_results_files(bench: Any, tmp_path: Path) -> None:
    records = [
        _record(bench, "p+a", checkable=True, top="int i = 0;", shown="int i = 0;"),
        _record(bench, "p+a", checkable=True, top="i +", shown="int j = 1;"),
        _record(bench, "p+b", checkable=True, top=None, shown="x\ny"),
        _record(bench, "p+b", checkable=False, top=None, shown=""),
    ]
    summary = bench.summarise(records)
    assert summary["all"]["sampled"] == 4 and summary["all"]["checkable"] == 3
    assert summary["all"]["top_compiles"]["hits"] == 1 and summary["all"]["shown_compiles"]["hits"] == 2
    assert summary["all"]["shown_exact"]["hits"] == 1 and summary["all"]["greedy_blank"]["hits"] == 1
    assert summary["p+b"]["shown_multiline"] == {"n": 1, "hits": 1, "rate": 1.0}
    meta = {
        "model_name": "m",
        "holes": 4,
        "machine": "test",
        "command": "python benchmarks/tiny_heldout.py",
        "date": "today",
        "seed": 0,
        "model_path": "/m",
        "model_info": "m",
        "weights_sha256": {"model.safetensors": "00"},
        "settings": {"max_latency_ms": 0},
        "nvcc": "none",
        "validator": "2 workers",
        "files": 2,
        "hole_lines": 9,
        "per_file": 3,
        "candidates": 4,
    }
    bench.write_results(tmp_path, "tiny_heldout_m", meta, records)
    md = (tmp_path / "tiny_heldout_m.md").read_text()
    assert "| shown (rank 0 after validation) compiles | 2/3 (67%) |" in md
    assert "unfinished: 4/4" in md and "`p+b/k.cu` line 4: garbage: compiled" in md
    assert json.loads((tmp_path / "tiny_heldout_m.json").read_text())["summary"]["all"]["filled"] == 3


def test_greedy_fill_goes_through_the_services_cut(bench: Any) -> None:
    call = {"texts": ["int k = 1;\n    more();"], "shape": "statement", "prefix": "{\n    "}
    assert bench.greedy_fill(call, "byte") == "int k = 1;"
    assert bench.greedy_fill({"texts": ["a\nb"], "shape": None, "prefix": "{\n"}, "byte") == "a\nb"
    # after the hole's indentation the blanks a model writes again go, as the service drops them
    call = {"texts": [" int k = 1;"], "shape": "statement", "prefix": "{\n    "}
    assert bench.greedy_fill(call, "byte") == "int k = 1;"
    call = {"texts": ["    int k = 1;\n"], "shape": "statement", "prefix": "{\n"}
    assert bench.greedy_fill(call, "line") == "int k = 1;"


def _heldout_data(root: Path) -> tuple[Path, Path]:
    """A heldout_files.jsonl.gz (cuda-corpus rows) and the split.json that says why each is held out."""
    rows = [
        {"id": "own/alpha:src/k.cu", "repo": "own/alpha", "path": "src/k.cu", "text": KERNEL},
        {"repo": "own/alpha", "path": "src/twice.cuh", "text": HEADER},  # no "id": repo:path
        {"id": "own/alpha:src/host.h", "repo": "own/alpha", "path": "src/host.h", "text": HEADER},
        {"id": "own/beta:k.cu", "repo": "own/beta", "path": "k.cu", "text": KERNEL.replace("scale", "s2")},
        {"id": "held/proj:x.cu", "repo": "held/proj", "path": "x.cu", "text": KERNEL},  # held out by project
        {"id": "own/gamma:y.cu", "repo": "own/gamma", "path": "y.cu", "text": KERNEL},  # not in the split
    ]
    heldout = root / "heldout_files.jsonl.gz"
    with gzip.open(heldout, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({**row, "license": "MIT", "commit": "0" * 40}) + "\n")
    whys = {"own/alpha:src/k.cu": "file", "own/alpha:src/twice.cuh": "file", "own/alpha:src/host.h": "file"}
    whys |= {"own/beta:k.cu": "file", "held/proj:x.cu": "project"}
    split = root / "split.json"
    split.write_text(json.dumps({"heldout_files": [{"id": k, "why": v} for k, v in whys.items()]}))
    return heldout, split


def test_heldout_files_set_samples_files_held_out_by_file(bench: Any, tmp_path: Path) -> None:
    heldout, split = _heldout_data(tmp_path)
    rows, counts = bench.heldout_by_file(heldout, split)
    assert [r["id"] for r in rows] == ["own/alpha:src/k.cu", "own/alpha:src/twice.cuh", "own/beta:k.cu"]
    assert counts == {
        "split_heldout_by_file": 4,
        "split_heldout_by_project": 1,
        "rows_held_out_by_file": 4,
        "rows_not_cu": 1,  # host.h: not a file the editor fills
    }
    kwargs = {"checkable": 5, "max_sampled": 100, "seed": 0, "per_file": 3}
    hs = bench.heldout_files_set(heldout, split, tmp_path / "ws", **kwargs)
    assert hs.name == "heldout-files" and hs.compile_commands is None
    assert hs.stop_after == 5 and hs.file_precheck
    assert hs.info["files"] == 3 and hs.info["projects"] == 2 and hs.info["databases_above"] == []
    assert hs.info["candidate_holes"] == len(hs.holes) == 3 + 2 + 3  # at most 3 per file
    assert [h.project for h in hs.holes[:2]] == ["own+alpha", "own+beta"]  # round-robin over projects
    for rel in {h.file for h in hs.holes}:
        base = hs.bases[rel]
        # each file alone in its own workspace, at its repository path
        assert [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()] == [rel]
        assert hs.workspaces[rel] == base / rel.split("/")[0]
    for h in hs.holes:
        assert hs.path(h).read_text().splitlines()[h.line].strip() == h.original
    again = bench.heldout_files_set(heldout, split, tmp_path / "ws2", **kwargs)
    assert again.holes == hs.holes  # seeded
    only_beta = bench.heldout_files_set(heldout, split, tmp_path / "ws3", **kwargs, projects=["BETA"])
    assert {h.project for h in only_beta.holes} == {"own+beta"}
    capped = bench.heldout_files_set(heldout, split, tmp_path / "ws4", **{**kwargs, "max_sampled": 4})
    assert len(capped.holes) == 4


def test_heldout_files_set_absent_is_skipped_with_a_message(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--set", "heldout-files", "--heldout-files", str(tmp_path / "none.jsonl.gz")]
    assert bench.main([*args, "--split", str(tmp_path / "split.json"), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "none.jsonl.gz" in err and "no heldout-files holes" in err
    assert not list(tmp_path.glob("tiny_heldout*"))


def test_summary_by_set_and_checkability(bench: Any, tmp_path: Path) -> None:
    records = [
        _record(bench, "p+a", checkable=True, top="int i = 0;", shown="int i = 0;"),
        _record(bench, "p+b", checkable=False, top=None, shown=""),
        _record(bench, "p+b", checkable=False, top=None, shown=""),
    ]
    records[0]["set"], records[1]["set"], records[2]["set"] = "realproj", "heldout-files", "heldout-files"
    records[1] |= {"why_not": "original does not compile: missing header", "file": "p+b/one.cu"}
    records[2]["why_not"] = "garbage not caught"
    verdict = {"checker": "nvcc", "command": "no compile command: folder + workspace on the include path"}
    for r in records:
        r["original_verdict"] = verdict
    summary = bench.summarise(records, "set")
    assert list(summary) == ["all", "heldout-files", "realproj"]
    assert summary["heldout-files"]["checkable"] == 0 and summary["realproj"]["filled"] == 1
    assert list(bench.summarise(records, None)) == ["all"]
    checks = bench.checkability(records)["heldout-files"]
    assert checks["tried"] == 2 and checks["checkable"] == 0 and checks["files_tried"] == 2
    assert checks["why_not"] == {"original does not compile: missing header": 1, "garbage not caught": 1}
    assert checks["original_checker"] == {"nvcc": 2}


def test_quick_end_to_end_on_realproj(
    bench: Any, tiny_checkpoint: Path, shared_data: Path, tmp_path: Path
) -> None:
    """Two Learn-CUDA-Programming holes (the fastest nvcc checks), one candidate, the tiny random model."""
    from dice.validator.paths import nvcc_path

    data = shared_data
    if not (data / "realproj" / "compile_commands.template.json").is_file():
        pytest.skip("../shared/data/realproj is absent")
    if nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    args = ["--quick", "--holes", "2", "--candidates", "1", "--projects", "Learn-CUDA"]
    args += ["--model", str(tiny_checkpoint), "--data", str(data), "--results", str(tmp_path)]
    assert bench.main(args) == 0
    name = tiny_checkpoint.name
    records = [json.loads(x) for x in (tmp_path / f"tiny_heldout_{name}.jsonl").read_text().splitlines()]
    assert len(records) == 2
    assert all(r["project"] == "PacktPublishing+Learn-CUDA-Programming" for r in records)
    for r in records:
        assert r["original_verdict"]["checker"] == "nvcc"
        assert r["original_verdict"]["command"] == "compile_commands.json entry"
        if r["checkable"]:
            assert r["greedy_blank"] or r["model_top"]["greedy"]
            assert all(c["checker"] == "nvcc" for c in r["candidates"])
    result = json.loads((tmp_path / f"tiny_heldout_{name}.json").read_text())
    assert result["finished"] and result["summary"]["all"]["sampled"] == 2
    assert (tmp_path / f"tiny_heldout_{name}.md").is_file()


DEVICE_ONLY = """\
__global__ void axpy(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = a * x[i];
    if (i < n) y[i] = v + y[i];
}
"""


def test_quick_end_to_end_on_heldout_files(bench: Any, tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A file that needs its project's header (not checkable, one compile) and a device-only file (NVRTC
    decides, checkable): the run stops at the first checkable hole. The tiny random model, one candidate."""
    from dice.validator.paths import nvcc_path

    if nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    rows = [
        {
            "id": "own/alpha:k.cu",
            "repo": "own/alpha",
            "path": "k.cu",
            "text": '#include "own.h"\n' + DEVICE_ONLY,
        },
        {"id": "own/beta:k.cu", "repo": "own/beta", "path": "k.cu", "text": DEVICE_ONLY},
        {"id": "own/gamma:k.cu", "repo": "own/gamma", "path": "k.cu", "text": DEVICE_ONLY},
    ]
    heldout = tmp_path / "heldout_files.jsonl.gz"
    with gzip.open(heldout, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"heldout_files": [{"id": r["id"], "why": "file"} for r in rows]}))
    args = ["--set", "heldout-files", "--holes", "1", "--candidates", "1", "--per-file", "1"]
    args += ["--heldout-files", str(heldout), "--split", str(split), "--model", str(tiny_checkpoint)]
    assert bench.main([*args, "--results", str(tmp_path / "out")]) == 0
    stem = f"tiny_heldout_files_{tiny_checkpoint.name}"
    records = [json.loads(x) for x in (tmp_path / "out" / f"{stem}.jsonl").read_text().splitlines()]
    assert [(r["set"], r["project"], r["checkable"]) for r in records] == [
        ("heldout-files", "own+alpha", False),
        ("heldout-files", "own+beta", True),
    ]  # gamma is never tried
    assert records[0]["why_not"] == "original does not compile: missing header"
    assert records[1]["original_verdict"]["checker"] == "nvrtc" and "candidates" in records[1]
    result = json.loads((tmp_path / "out" / f"{stem}.json").read_text())
    assert result["finished"] and result["checkability"]["heldout-files"]["checkable"] == 1
    assert list(result["summary"]) == ["all"]
    md = (tmp_path / "out" / f"{stem}.md").read_text()
    assert "split file `" in md and "| holes tried / checkable / filled | 2 / 1 / 1 |" in md
