"""CuKe dedup: normalised code, exact and MinHash near duplicates, the keep-the-faster rule, contamination
against both KernelBench versions (synthetic here; on the shared data when it is present)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from training.cuke.dedup import (
    MinHashIndex,
    contamination,
    contamination_table,
    dedup_pairs,
    eval_problems_from,
    exact_key,
    normalize_code,
)
from training.cuke.records import Pair

REF = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """Simple model that performs a ReLU activation."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

batch_size = {batch}
dim = {dim}

def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
'''

ELEMENTWISE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Fused ReLU kernel
source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_FLOAT(x) TORCH_CHECK(x.scalar_type() == at::kFloat, #x " must be float32")

// one thread per element
__global__ void relu_kernel(const float* __restrict__ input, float* __restrict__ output, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        float val = input[idx];
        output[idx] = val > 0.0f ? val : 0.0f;  /* the max */
    }
}

torch::Tensor relu_cuda(torch::Tensor input) {
    CHECK_CUDA(input);
    CHECK_CONTIGUOUS(input);
    CHECK_FLOAT(input);
    auto output = torch::empty_like(input);
    int size = input.numel();
    const int block_size = 256;
    const int num_blocks = (size + block_size - 1) / block_size;
    relu_kernel<<<num_blocks, block_size>>>(input.data_ptr<float>(), output.data_ptr<float>(), size);
    return output;
}
"""

cpp_source = "torch::Tensor relu_cuda(torch::Tensor input);"

relu_ext = load_inline(
    name="relu_ext",
    cpp_sources=cpp_source,
    cuda_sources=source,
    functions=["relu_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """ReLU through a custom kernel."""

    def __init__(self):
        super().__init__()
        self.relu = relu_ext

    def forward(self, x):
        # contiguous input
        return self.relu.relu_cuda(x.contiguous())
'''

REDUCTION = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#include <torch/extension.h>
template <int BLOCK>
__global__ void rowsum(const float* a, float* out, int cols) {
    __shared__ float buf[BLOCK];
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) acc += a[blockIdx.x * cols + c];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
torch::Tensor rows(torch::Tensor a) {
    auto out = torch::zeros({a.size(0)}, a.options());
    rowsum<512><<<a.size(0), 512>>>(a.data_ptr<float>(), out.data_ptr<float>(), a.size(1));
    return out;
}
"""
ext = load_inline("rows", cpp_sources="torch::Tensor rows(torch::Tensor a);", cuda_sources=src,
                  functions=["rows"])

class ModelNew(nn.Module):
    def forward(self, a):
        return ext.rows(a).unsqueeze(1)
'''


def reformatted(code: str) -> str:
    """The same program, re-indented, re-wrapped and re-commented."""
    out = code.replace("    ", "  ").replace("(\n", "(  \n").replace("verbose=False,", "verbose = False ,")
    out = out.replace("# Fused ReLU kernel", "# a different comment\n# on two lines")
    out = out.replace("// one thread per element", "/* block-stride\n   loop not needed */")
    return out.replace('"""ReLU through a custom kernel."""', '"""Another docstring."""\n')


def renamed(code: str) -> str:
    """One variable renamed (``idx``, four uses in the kernel)."""
    return code.replace("idx", "i")


def pair(pid: str, cuda: str | None, *, problem: str = "L1P19", version: str = "v0", ref: str | None = None,
         speedup: float | None = None, source: str = "test") -> Pair:  # fmt: skip
    meta = {} if speedup is None else {"speedup": speedup}
    ref = ref if ref is not None else REF.format(batch=16, dim=16384)
    level = int(problem[1 : problem.index("P")])
    return Pair(pid, source, ref, cuda, problem=problem, kb_version=version, level=level, meta=meta)


# ------------------------------------------------------------------------------------------ normalisation
def test_normalisation_drops_comments_docstrings_and_layout() -> None:
    norm = normalize_code(ELEMENTWISE)
    assert "Fused" not in norm and "one thread" not in norm and "the max" not in norm
    assert "custom kernel" not in norm and "contiguous input" not in norm
    assert "__global__ void relu_kernel" in norm and "# include < torch / extension . h >" in norm
    assert "\n" not in norm and "  " not in norm
    assert normalize_code(reformatted(ELEMENTWISE)) == norm
    assert normalize_code(ELEMENTWISE) == norm  # stable (and cached)


def test_c_comment_markers_inside_string_literals_are_kept() -> None:
    code = 'src = """\nconst char* u = "http://x";  // gone\nint a; /* gone too */\n"""\n'
    norm = normalize_code(code)
    assert "http : / / x" in norm and "gone" not in norm


def test_non_python_text_is_normalised_too() -> None:
    cu = "#include <cuda.h>\n// a comment\n__global__ void k(float* x) {  /* body */\n  x[0] = 1;\n}\n"
    assert normalize_code(cu) == normalize_code(cu.replace("  ", "\t").replace("// a comment", ""))
    assert "comment" not in normalize_code(cu) and "# include" in normalize_code(cu)


def test_exact_key() -> None:
    a, b = pair("a", ELEMENTWISE), pair("b", reformatted(ELEMENTWISE))
    assert exact_key(a) == exact_key(b)
    assert exact_key(a) != exact_key(pair("c", REDUCTION))
    assert exact_key(a) != exact_key(pair("d", ELEMENTWISE, ref=REF.format(batch=32, dim=4096)))
    assert exact_key(pair("e", None)) != exact_key(a)


# ------------------------------------------------------------------------------------------ MinHash index
def test_minhash_index_finds_near_duplicates_only() -> None:
    index = MinHashIndex()
    index.add("relu", ELEMENTWISE)
    index.add("sum", REDUCTION)
    assert len(index) == 2 and "relu" in index
    hits = index.query(renamed(ELEMENTWISE))
    assert [k for k, _ in hits] == ["relu"] and 0.85 <= hits[0][1] < 1.0
    assert index.query(reformatted(ELEMENTWISE)) == [("relu", 1.0)]
    assert [k for k, _ in index.query(REDUCTION)] == ["sum"]
    assert index.query("completely unrelated text with no kernel at all in it whatsoever") == []
    index.remove("relu")
    assert index.query(ELEMENTWISE) == [] and len(index) == 1
    with pytest.raises(ValueError):
        MinHashIndex(threshold=0)


# ------------------------------------------------------------------------------------------------- dedup
def test_exact_and_near_duplicates_are_dropped_different_kernels_kept() -> None:
    pairs = [
        pair("a", ELEMENTWISE),
        pair("b", reformatted(ELEMENTWISE)),  # exact after normalisation
        pair("c", renamed(ELEMENTWISE)),  # near
        pair("d", REDUCTION),  # another kernel for the same problem
        # The same kernel for another problem of the same version (its reference differs only in a size).
        pair("e", ELEMENTWISE, problem="L1P20", ref=REF.format(batch=16, dim=16385)),
    ]
    result = dedup_pairs(pairs)
    assert [p.id for p in result.kept] == ["a", "d", "e"]
    by_id = {d.pair_id: d for d in result.dropped}
    assert (by_id["b"].reason, by_id["b"].duplicate_of, by_id["b"].similarity) == ("exact", "a", 1.0)
    assert (
        by_id["c"].reason == "near" and by_id["c"].duplicate_of == "a" and 0.85 <= by_id["c"].similarity < 1
    )


def test_same_kernel_across_versions_is_one_problem() -> None:
    v0 = pair("v0", ELEMENTWISE, version="v0")
    cur = pair("cur", renamed(ELEMENTWISE), version="current", ref=REF.format(batch=4096, dim=393216))
    assert [p.id for p in dedup_pairs([v0, cur]).kept] == ["v0"]
    # No key known: the references' text decides (sizes only differ: near, same problem).
    a = Pair("a", "t", REF.format(batch=16, dim=16384), ELEMENTWISE)
    b = Pair("b", "t", REF.format(batch=16, dim=16384) + "\n# note\n", renamed(ELEMENTWISE))
    assert [p.id for p in dedup_pairs([a, b]).kept] == ["a"]
    other = Pair("c", "t", REDUCTION.replace("ModelNew", "Model"), renamed(ELEMENTWISE))
    assert [p.id for p in dedup_pairs([a, other]).kept] == ["a", "c"]


def test_the_faster_duplicate_is_kept() -> None:
    pairs = [
        pair("slow", ELEMENTWISE, speedup=1.5),
        pair("copy", reformatted(ELEMENTWISE)),  # no speedup: the first is kept
        pair("fast", renamed(ELEMENTWISE), speedup=3.0),
        pair("faster-not", ELEMENTWISE, speedup=2.0),
    ]
    result = dedup_pairs(pairs)
    assert [p.id for p in result.kept] == ["fast"]
    by_id = {d.pair_id: d for d in result.dropped}
    assert by_id["slow"].duplicate_of == "fast" and by_id["slow"].reason == "near"
    assert by_id["copy"].duplicate_of == "fast"  # followed the replaced keeper
    assert by_id["faster-not"].duplicate_of == "fast"
    assert [d.pair_id for d in result.dropped] == ["slow", "copy", "faster-not"]


def test_reference_only_pairs_dedup_on_the_reference() -> None:
    pairs = [
        pair("r1", None),
        pair("r2", None, ref=REF.format(batch=16, dim=16384).replace("# comment", "")),
        pair("r3", None, ref=REF.format(batch=16, dim=16384) + "# trailing comment\n"),
        pair("r4", None, problem="L1P20", ref=REF.format(batch=16, dim=16384).replace("relu", "sigmoid")),
        pair("with-candidate", ELEMENTWISE),
    ]
    result = dedup_pairs(pairs)
    assert [p.id for p in result.kept] == ["r1", "r4", "with-candidate"]
    assert {d.pair_id: d.reason for d in result.dropped} == {"r2": "exact", "r3": "exact"}
    with pytest.raises(ValueError, match="unique"):
        dedup_pairs([pair("x", None), pair("x", ELEMENTWISE)])


# ----------------------------------------------------------------------------------------- contamination
def test_contamination_on_both_versions() -> None:
    problems = [
        pair("kb-v0-19", None, version="v0"),
        pair("kb-cur-19", None, version="current", ref=REF.format(batch=4096, dim=393216)),
        pair("kb-cur-20", None, problem="L1P20", version="current",
             ref=REF.format(batch=8, dim=8).replace("relu", "sigmoid").replace("ReLU", "Sigmoid")),
        pair("kb-v0-19-again", None, version="v0"),
        pair("kb-l4", None, problem="L4P1", version="current"),
        Pair("no-version", "t", REF.format(batch=1, dim=1), None, problem="L1P21"),
    ]  # fmt: skip
    evals = eval_problems_from(problems)
    assert [e.problem_ref for e in evals] == ["v0:L1P19", "current:L1P19", "current:L1P20"]
    assert all(e.cuda_code is None and e.level == 1 for e in evals)
    pairs = [
        pair("p-v0", ELEMENTWISE),  # v0 reference verbatim, key L1P19
        Pair("p-nokey", "other", REF.format(batch=4096, dim=393216) + "# hi\n", REDUCTION),  # current text
        Pair(
            "p-near", "other", REF.format(batch=4096, dim=393217), REDUCTION, problem="L1P99", kb_version="v0"
        ),
        Pair("p-clean", "other", REDUCTION.replace("ModelNew", "Model"), REDUCTION, problem="L2P3"),
    ]
    matches = contamination(pairs, evals)
    assert [(m.eval_ref, m.kind) for m in matches["p-v0"]] == [
        ("v0:L1P19", "exact"),
        ("current:L1P19", "key"),
    ]
    assert matches["p-v0"][1].similarity < 0.85
    assert [(m.eval_ref, m.kind) for m in matches["p-nokey"]] == [("current:L1P19", "exact")]
    assert [(m.eval_ref, m.kind) for m in matches["p-near"]] == [("current:L1P19", "near")]
    assert matches["p-clean"] == []
    rows = contamination_table(pairs, matches, evals)
    row = next(
        r for r in rows if r["source"] == "other" and r["eval_version"] == "current" and r["level"] is None
    )
    assert (row["pairs"], row["overlapping"], row["exact"], row["problems_hit"]) == (1, 1, 1, 1)
    row = next(r for r in rows if r["source"] == "test" and r["eval_version"] == "v0")
    assert (row["pairs"], row["overlapping"], row["exact"], row["eval_problems"]) == (1, 1, 1, 1)


def _shared_pairs(data: Path) -> tuple[list[Pair], list[Pair]]:
    """The shared data as pairs, read with the corpus readers (the CuKe readers are tested on their own)."""
    from training.corpus import sources

    pairs = []
    for i, s in enumerate(sources.read_cuda_l1(data / "cuda-l1")):
        pairs.append(Pair(f"l1:{i}", s.source, s.ref_src, s.program, s.group, "v0", int(s.group[1])))
    problems = []
    for line in (data / "kernelbench" / "problems.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        key = f"L{r['level']}P{r['problem_id']}"
        problems.append(
            Pair(f"kb:{key}", "kernelbench", r["code"], None, key, "current", r["level"], r["name"])
        )
    return pairs, problems


def test_contamination_on_the_shared_data(shared_data: Path) -> None:
    if not (shared_data / "cuda-l1").is_dir() or not (shared_data / "kernelbench").is_dir():
        pytest.skip("cuda-l1 or kernelbench is absent from the shared data")
    pairs, problems = _shared_pairs(shared_data)
    evals = eval_problems_from([*problems, *pairs])
    assert Counter(e.kb_version for e in evals) == {"current": 250, "v0": 250}  # levels 1-3 only
    matches = contamination(pairs, evals)
    for p in pairs:  # CUDA-L1's references are the v0 problems verbatim; the current twin shares the key
        kinds = {m.eval_ref: m.kind for m in matches[p.id]}
        assert kinds[f"v0:{p.problem}"] == "exact" and kinds[f"current:{p.problem}"] in ("near", "key")
    rows = contamination_table(pairs, matches, evals)
    v0 = [r for r in rows if r["eval_version"] == "v0"]
    assert sum(r["overlapping"] for r in v0) == len(pairs) and all(
        r["problems_hit"] == r["eval_problems"] for r in v0
    )
    result = dedup_pairs(pairs)
    assert 0 < len(result.dropped) < len(pairs)
    kept = {p.id: p for p in result.kept}
    assert all(kept[d.duplicate_of].problem == next(p for p in pairs if p.id == d.pair_id).problem
               for d in result.dropped)  # fmt: skip
