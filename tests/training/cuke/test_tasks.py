"""CuKe's task derivation: DICE's SFT / infilling / end-to-end records and the editor's ``.cu`` infill tasks.

The split is checked for identity on every real program of ``../shared/data`` (PR-67 and CUDA-L1) when the
data is there, and for DICE's shape on handwritten programs; the ``.cu`` tasks with a stub compile check,
plus one real NVRTC compile.
"""

from __future__ import annotations

import textwrap
from functools import cache
from pathlib import Path

import pytest

from training.cuke.cu_tasks import MASK, CuSource, CuTaskStats, cu_infill_tasks, expression_cuts, hole_cuts
from training.cuke.records import CuFile, Pair
from training.cuke.tasks import (
    e2e_record,
    infill_record,
    infill_split,
    kernelbench_user_prompt,
    kernels_as_cu_files,
    nvrtc_compiles,
    sft_record,
)

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"

REFERENCE = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)


    def get_inputs():
        return [torch.randn(16, 16)]


    def get_init_inputs():
        return []
    """
)

KERNEL = textwrap.dedent(
    """\
    #include <torch/extension.h>

    __global__ void relu_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) {
            y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        }
    }

    torch::Tensor relu_cuda(torch::Tensor x) {
        auto y = torch::empty_like(x);
        int n = x.numel();
        relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y;
    }
    """
)

PROGRAM = (
    "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
    "# the kernel\n"
    f'source = """\n{KERNEL}"""\n\n'
    'cpp_src = "torch::Tensor relu_cuda(torch::Tensor x);"\n\n'
    "relu = load_inline(name='relu', cpp_sources=cpp_src, cuda_sources=source, functions=['relu_cuda'])\n\n\n"
    "class ModelNew(nn.Module):\n    def forward(self, x):\n        return relu.relu_cuda(x)\n"
)


def _pair(program: str = PROGRAM, **kw) -> Pair:
    return Pair(id="test:0", source="test", pytorch_code=REFERENCE, cuda_code=program, **kw)


@cache
def _real_programs() -> tuple[str, ...]:
    if not (DATA / "kernelbench-pr67-dsr1").is_dir() or not (DATA / "cuda-l1").is_dir():
        return ()
    pytest.importorskip("pyarrow")
    from training.corpus.sources import read_cuda_l1, read_pr67

    sols = [*read_pr67(DATA / "kernelbench-pr67-dsr1"), *read_cuda_l1(DATA / "cuda-l1")]
    return tuple(s.program for s in sols if s.program)


# --- the DICE split -------------------------------------------------------------------------------------


def test_split_has_dices_shape() -> None:
    prefix, middle, suffix = infill_split(PROGRAM)
    assert prefix.endswith("# the kernel\n")  # imports and comments up to the assignment's line
    assert middle.startswith('source = """') and middle.endswith('"""')
    assert "__global__ void relu_kernel" in middle and middle.count('"""') == 2
    assert suffix.startswith("\n\ncpp_src")  # the line break after the closing quotes is the suffix's
    assert prefix + middle + suffix == PROGRAM


def test_split_prefers_the_string_load_inline_compiles() -> None:
    # DICE's records hide the cuda_sources string even when it holds no __global__ (cuBLAS wrappers).
    program = (
        'helper = """__global__ void unused() {}"""\n'
        'source = """torch::Tensor f(torch::Tensor x) { return x; }"""\n'
        "m = load_inline(name='m', cpp_sources='', cuda_sources=[source], functions=['f'])\n"
    )
    prefix, middle, suffix = infill_split(program)
    assert middle.startswith("source = ") and prefix.startswith("helper")
    assert suffix == "\nm = load_inline(name='m', cpp_sources='', cuda_sources=[source], functions=['f'])\n"


def test_split_of_a_nested_assignment_keeps_its_indentation_in_the_middle() -> None:
    program = (
        "class ModelNew:\n    def __init__(self):\n"
        '        self.src = r"""__global__ void k(float* x) { x[0] = 1.0f; }"""  # kernel\n'
        "        self.mod = load_inline('k', '', cuda_sources=self.src)\n"
    )
    prefix, middle, suffix = infill_split(program)
    assert prefix == "class ModelNew:\n    def __init__(self):\n"
    assert middle == '        self.src = r"""__global__ void k(float* x) { x[0] = 1.0f; }"""  # kernel'
    assert prefix + middle + suffix == program


def test_split_of_an_inline_literal_is_the_call_statement() -> None:
    program = "import x\nmod = load_inline(\n    'k', '',\n    cuda_sources='__global__ void k() {}',\n)\n"
    program += "rest = 1\n"
    prefix, middle, suffix = infill_split(program)
    assert (prefix, suffix) == ("import x\n", "\nrest = 1\n")
    assert middle.startswith("mod = load_inline(") and middle.endswith(")")


@pytest.mark.parametrize(
    "program",
    [
        "import torch\nclass ModelNew:\n    pass\n",  # no kernel
        "src = '__global__ void ' + 'k() {}'\nm = load_inline('m', '', cuda_sources=src)\n",  # concatenated
        'n = 3\nsrc = f"""__global__ void k() {{ int a = {n}; }}"""\n',  # built at run time
        'x = 1; src = """__global__ void k() {}"""\n',  # not the first statement on its line
        "def broken(:\n",
    ],
)
def test_split_is_none_without_a_literal_assignment(program: str) -> None:
    assert infill_split(program) is None


def test_split_identity_with_crlf_and_non_ascii() -> None:
    program = PROGRAM.replace("# the kernel", "# noyau: é→ü").replace("\n", "\r\n")
    prefix, middle, suffix = infill_split(program)
    assert prefix + middle + suffix == program
    assert middle.startswith("source = ") and suffix.startswith("\r\n\r\ncpp_src")


def test_split_identity_and_shape_on_every_real_program() -> None:
    programs = _real_programs()
    if not programs:
        pytest.skip("no PR-67 / CUDA-L1 data in ../shared/data")
    split = 0
    for program in programs:
        parts = infill_split(program)
        if parts is None:
            continue
        split += 1
        prefix, middle, suffix = parts
        assert prefix + middle + suffix == program
        assert prefix == "" or prefix.endswith("\n")
        assert suffix == "" or suffix.startswith(("\n", "\r"))
        assert "\n" not in middle.split("=", 1)[0]  # the assignment's target starts the middle
    assert split >= 0.7 * len(programs)  # 881 of 1,157: the rest build their source at run time or have none


# --- records --------------------------------------------------------------------------------------------


def test_sft_record_is_user_text_and_the_fenced_program() -> None:
    from engine.prompts import chat, kernelbench_prompt

    rec = sft_record(_pair(problem="L1P19", kb_version="v0"), level=1, speedup=2.5)
    assert set(rec) == {"id", "prompt", "response", "level", "source", "speedup", "group"}
    assert "<|im_start|>" not in rec["prompt"] and "<|im_end|>" not in rec["prompt"]
    assert chat(rec["prompt"]) == kernelbench_prompt(REFERENCE)
    assert rec["prompt"] == kernelbench_user_prompt(REFERENCE) and REFERENCE in rec["prompt"]
    assert rec["response"] == f"```python\n{PROGRAM.rstrip()}\n```"
    assert (rec["level"], rec["speedup"], rec["group"], rec["source"]) == (1, 2.5, "v0:L1P19", "test")
    assert sft_record(_pair(), level=None, speedup=None)["group"] == "test:0"  # no problem: its own group


def test_infill_and_e2e_records() -> None:
    rec = infill_record(_pair(), level=2)
    assert set(rec) == {"id", "pytorch_code", "cuda_code", "prefix", "middle", "suffix", "level"}
    assert rec["prefix"] + rec["middle"] + rec["suffix"] == rec["cuda_code"] == PROGRAM
    assert infill_record(_pair("import torch\n"), level=2) is None
    assert e2e_record(_pair(), level=3) == {"id": "test:0", "pytorch_code": REFERENCE, "level": 3}
    with pytest.raises(ValueError, match="no candidate"):
        infill_record(Pair("r:1", "r", REFERENCE, None), level=1)


def test_kernels_as_cu_files() -> None:
    (src,) = kernels_as_cu_files(_pair())
    # the value, opening line break included, less its host wrapper (the reward's nvcc has no torch headers)
    host = KERNEL.index("torch::Tensor")
    assert "torch::Tensor" in KERNEL and "__global__" in KERNEL[:host]
    assert src == CuSource("test:0", "\n" + KERNEL[:host].rstrip() + "\n", False)
    two = PROGRAM.replace("cuda_sources=source", "cuda_sources=[source, other]").replace(
        "cpp_src =", 'other = """__global__ void k2(float* x) { x[0] = 2.0f; }"""\ncpp_src ='
    )
    assert [s.id for s in kernels_as_cu_files(_pair(two))] == ["test:0#0", "test:0#1"]
    raw = (
        'import cupy\nk = cupy.RawKernel(r"""extern "C" __global__ void k(float* x) { x[0] = 1; }""", "k")\n'
    )
    assert kernels_as_cu_files(_pair(raw))[0].text.startswith('extern "C" __global__')
    assert kernels_as_cu_files(_pair("import torch\n")) == []


# --- .cu infill tasks -----------------------------------------------------------------------------------

CU_FILE = textwrap.dedent(
    """\
    #include "common.cuh"

    namespace ops {
    __device__ inline float square(float v) { return v * v; }

    __global__ void sumsq(const float* __restrict__ x, float* out, int n) {
        float acc = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            acc += square(x[i]);
        }
        atomicAdd(out, acc);
    }
    }  // namespace ops

    template <int N>
    __global__ void fill(float* y) { y[threadIdx.x] = N * 2.0f; }

    void launch(float* x, float* out, int n) { ops::sumsq<<<1, 256>>>(x, out, n); }
    """
)


def _tasks(files, **kw) -> list[dict]:
    kw.setdefault("compile_check", lambda text: True)
    return list(cu_infill_tasks(files, **kw))


def test_cu_tasks_have_one_mask_and_their_target_restores_the_file() -> None:
    from dice.cuda_source import parse_document

    tasks = _tasks([("repo:a.cu", CU_FILE, False)], per_file=50, seed=3)
    assert {t["kind"] for t in tasks} == {"statement", "statements", "loop_body", "kernel_body", "expression"}
    for t in tasks:
        assert set(t) == {"id", "text", "target", "origin", "has_spec", "kind"}
        assert t["text"].count(MASK) == 1 and t["text"].replace(MASK, t["target"], 1) == CU_FILE
        doc = parse_document(t["text"])
        assert len(doc.masks) == 1 and not doc.malformed_masks
        assert doc.masks[0].function in ("square", "sumsq")  # never the template, never host code
        assert (t["origin"], t["has_spec"]) == ("repo:a.cu", False)
    assert len({t["id"] for t in tasks}) == len(tasks)
    assert len({(t["text"], t["target"]) for t in tasks}) == len(tasks)


def test_cu_tasks_are_seeded_and_balanced() -> None:
    files = [("repo:a.cu", CU_FILE, False), ("repo:b.cu", CU_FILE.replace("acc", "total"), True)]
    first = _tasks(files, per_file=5, seed=1)
    assert first == _tasks(files, per_file=5, seed=1)
    assert first[:5] == _tasks(files[:1], per_file=5, seed=1)  # a file's tasks do not depend on the others
    assert first != _tasks(files, per_file=5, seed=2)
    assert [t["kind"] for t in first[:5]] == [
        "statement",
        "expression",
        "kernel_body",
        "statements",
        "loop_body",
    ]
    assert {t["has_spec"] for t in first[5:]} == {True}


def test_cu_tasks_drop_files_failing_the_compile_check() -> None:
    seen: list[str] = []
    no_kernel = ("repo:host.cu", "int add(int a, int b) { return a + b; }\n", False)

    def check(text: str) -> bool:
        seen.append(text)
        return "bad" not in text

    stats = CuTaskStats()
    files = [("repo:bad.cu", CU_FILE + "// bad\n", False), ("repo:a.cu", CU_FILE, False), no_kernel]
    tasks = _tasks(files, compile_check=check, stats=stats)
    assert {t["origin"] for t in tasks} == {"repo:a.cu"}
    assert seen == [CU_FILE + "// bad\n", CU_FILE]  # the unmodified file, once; no hole: not compiled
    got = stats.to_json()
    assert (got["files"], got["with_holes"], got["compiled"], got["compile_failed"]) == (3, 2, 1, 1)
    assert got["tasks"] == len(tasks) == sum(got["by_kind"].values()) == 8


def test_cu_tasks_from_corpus_files_read_their_spec() -> None:
    spec = "/* dice-spec\nimport torch\ndef inputs():\n    return []\n*/\n"
    with_spec = CuFile("o/r:k.cu", "o/r", "k.cu", spec + CU_FILE)
    plain = CuFile("o/r:p.cu", "o/r", "p.cu", CU_FILE)
    tasks = _tasks([with_spec, plain], per_file=2)
    assert [(t["origin"], t["has_spec"]) for t in tasks] == [("o/r:k.cu", True)] * 2 + [
        ("o/r:p.cu", False)
    ] * 2


def test_a_file_with_a_mask_like_comment_keeps_only_holes_that_read_as_one_mask() -> None:
    text = CU_FILE.replace("float acc = 0.0f;", "float acc = 0.0f;  /* <MASK> */")
    tasks = _tasks([("repo:m.cu", text, False)], per_file=50)
    assert tasks and all(t["target"].count("<MASK>") == 1 for t in tasks)  # the old mask went with the hole


def test_expression_cuts_are_composite_one_line_expressions() -> None:
    src = (
        "__global__ void k(float* y, const float* x, int n) {\n  int i = blockIdx.x * 4 + 1;\n  int j = i;\n"
    )
    src += "  if (i < n) y[i + 1] = x[i] * 2.0f;\n  y[0] = 0;\n}\n"
    got = [src[c.start : c.end] for c in expression_cuts(src)]
    assert got == ["blockIdx.x * 4 + 1", "i < n", "i + 1", "x[i] * 2.0f"]


def test_hole_cuts_use_character_offsets() -> None:
    text = "// é\n__global__ void k(float* y) { y[threadIdx.x + 1] = 2.0f; }\n"
    assert "threadIdx.x + 1" in [text[c.start : c.end] for c in hole_cuts(text)]


def test_nvrtc_compiles_a_tiny_file() -> None:
    pytest.importorskip("cupy")
    assert nvrtc_compiles(KERNEL)  # host code dropped, torch headers stubbed, as the validator does
    assert not nvrtc_compiles(KERNEL.replace("y[i] =", "y[i] = undefined_name +"))
    assert not nvrtc_compiles("int host_only() { return 1; }\n")


def _no_bad(text: str) -> bool:  # module level: the worker processes import it
    return "bad" not in text


@pytest.mark.slow  # ~4 s: two spawned Python processes
def test_cu_tasks_across_worker_processes_match_the_serial_run() -> None:
    files = [
        (f"repo:{i}.cu", CU_FILE + ("// bad\n" if i % 3 == 0 else f"// {i}\n"), False) for i in range(10)
    ]
    serial = _tasks(files, compile_check=_no_bad, per_file=3)
    stats = CuTaskStats()
    assert _tasks(files, compile_check=_no_bad, per_file=3, workers=2, stats=stats) == serial
    assert (stats.files, stats.compiled, stats.tasks) == (10, 6, 18)
