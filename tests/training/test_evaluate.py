"""Held-out .cu infill evaluation: item selection and the generate -> NVRTC compile pipeline."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from training.corpus import Example
from training.evaluate import evaluate_heldout, select_infill_items

SOURCE = """#include <torch/extension.h>

__global__ void scale_kernel(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i];
    }
}

torch::Tensor scale_cuda(torch::Tensor x, float a) {
    auto y = torch::empty_like(x);
    scale_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), a, x.numel());
    return y;
}
"""


def infill_example(i: int, kind: str, middle: str) -> Example:
    start = SOURCE.index(middle)
    meta = {"kind": kind, "prefix": SOURCE[:start], "middle": middle, "suffix": SOURCE[start + len(middle) :]}
    return Example(f"cu-src{i}-0", f"L1P{i}", "cu_infill", "test", "prompt", middle, meta)


def test_selection_balances_kinds_and_skips_duplicates() -> None:
    exs = [
        infill_example(i % 3, "statement", "int i = blockIdx.x * blockDim.x + threadIdx.x;") for i in range(9)
    ]
    exs += [infill_example(7, "loop_body", "y[i] = a * x[i];")]
    picked = select_infill_items(exs, 10, seed=0)
    assert len(picked) == 4  # three distinct sources for "statement", one loop body
    assert picked[1].meta["kind"] == "loop_body"  # kinds alternate


def test_selection_takes_kinds_beyond_the_kernelbench_cuts() -> None:
    """The real-code corpus adds expression holes; they are picked too, after the KernelBench kinds."""
    exs = [infill_example(1, "statement", "y[i] = a * x[i];"), infill_example(2, "expression", "a * x[i]")]
    picked = select_infill_items(exs, 10, seed=0)
    assert [p.meta["kind"] for p in picked] == ["statement", "expression"]


def test_pipeline_compiles_reference_candidate_and_empty_fill(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    from engine.testing import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt")
    heldout = tmp_path / "heldout.jsonl.gz"
    with gzip.open(heldout, "wt") as fh:
        fh.write(infill_example(1, "statement", "y[i] = a * x[i];").to_json() + "\n")
    result = evaluate_heldout(ckpt, heldout, max_infill=1, max_new_tokens=8)
    (record,) = result["records"]
    assert record["reference_compiles"] is True  # the original device code compiles with NVRTC
    assert record["empty_compiles"] is True  # deleting this statement still compiles: the baseline
    assert result["summary"]["reference_compiles"] == 1
    assert result["summary"]["empty_fill_compile_rate"] == 1.0


def test_items_longer_than_the_context_are_skipped_and_counted(tmp_path: Path) -> None:
    """The length checked is the prompt the engine builds for the hole (the DICE infilling template around the
    file), not the record's own prompt text; the model's context caps ``seq_len``."""
    pytest.importorskip("cupy")
    from engine.testing import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt")
    heldout = tmp_path / "heldout.jsonl.gz"
    with gzip.open(heldout, "wt") as fh:
        fh.write(infill_example(1, "statement", "y[i] = a * x[i];").to_json() + "\n")
    result = evaluate_heldout(ckpt, heldout, seq_len=200, max_infill=1, max_new_tokens=8)
    assert result["records"] == []
    assert result["summary"]["skipped_too_long"] == 1 and result["summary"]["context_limit"] == 200


def test_a_hole_in_host_code_is_not_counted_as_compiled(tmp_path: Path) -> None:
    """NVRTC compiles the device code only: a fill in the torch wrapper is never type-checked, so the item
    is counted as ``not_checked`` and left out of the rates (it used to count as compiled, whatever the
    model wrote there)."""
    pytest.importorskip("cupy")
    from engine.testing import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt")
    heldout = tmp_path / "heldout.jsonl.gz"
    with gzip.open(heldout, "wt") as fh:
        fh.write(infill_example(1, "statement", "auto y = torch::empty_like(x);").to_json() + "\n")
        fh.write(infill_example(2, "statement", "y[i] = a * x[i];").to_json() + "\n")
    result = evaluate_heldout(ckpt, heldout, max_infill=2, max_new_tokens=8)
    by_middle = {r["middle"]: r for r in result["records"]}
    assert by_middle["auto y = torch::empty_like(x);"]["hole_checked"] is False
    assert by_middle["y[i] = a * x[i];"]["hole_checked"] is True
    summary = result["summary"]
    assert (summary["reference_compiles"], summary["not_checked"], summary["checked"]) == (2, 1, 1)
