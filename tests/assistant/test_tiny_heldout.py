"""benchmarks/tiny_heldout.py: the hole sampler, the mask line and the summary on a synthetic project (no
model, no ../shared), and a two-hole end-to-end run on realproj with the tiny random checkpoint (skipped
without ../shared/data/realproj or nvcc)."""

from __future__ import annotations

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
    bench.write_results(tmp_path, "m", meta, records)
    md = (tmp_path / "tiny_heldout_m.md").read_text()
    assert "| shown (rank 0 after validation) compiles | 2/3 (67%) |" in md
    assert "unfinished: 4/4" in md and "`p+b/k.cu` line 4: garbage: compiled" in md
    assert json.loads((tmp_path / "tiny_heldout_m.json").read_text())["summary"]["all"]["filled"] == 3


def test_greedy_fill_goes_through_the_services_cut(bench: Any) -> None:
    call = {"texts": ["int k = 1;\n    more();"], "shape": "statement"}
    assert bench.greedy_fill(call, "byte") == "int k = 1;"
    assert bench.greedy_fill({"texts": ["a\nb"], "shape": None}, "byte") == "a\nb"


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
