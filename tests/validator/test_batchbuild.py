"""Batched builds (dice.validator.batchsource, dice.validator.batchbuild): which calls batch, the combined
text (namespaces, hoisted includes, #undef'd macros, probes, bindings), blaming errors, the blame/split loop
and discovery with the compiler stubbed; then real builds: C++-only candidates built as one extension and
served to their own load_inline afterwards (slow: two builds), a combined CUDA TU through nvcc, the pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dice.validator import batchbuild, buildtext, fastbuild
from dice.validator.batchsource import TU, Unit, attribute, compose, mask_literals, prepare, scan_tu
from dice.validator.builds import cached_extension_builds, import_source
from dice.validator.paths import nvcc_path


def unit(cpp: str, cuda: str | None = None, functions: Any = None, key: str = "k", **kw: Any) -> Unit:
    return Unit(key, "ext", cpp, cuda, functions or {"f": "f"}, **kw)


# ---------------------------------------------------------------------------------------------- what batches
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}", "own module"),
        ('TORCH_LIBRARY(myops, m) { m.def("f"); }', "own module"),
        ('extern "C" __global__ void k() {}', "extern"),
        ('const char* s = R"(#include <x>)";', "raw string"),
        ("#ifdef USE_HALF\n#include <cuda_fp16.h>\n#endif\n", "inside #if"),
        ("#define N 4\n#include <cuda_fp16.h>\n", "before an #include"),
        ("__device__ float fmaxf(float a, float b) { return a; }", "fmaxf"),
        ("__device__ float max(float a, float b) { return a; }", "max"),
        ("namespace at { void extra(); }", "at"),
        ("struct S {}; S operator+(S a, S b) { return a; }", "operator"),
        ("int f( {", "parse"),
    ],
)
def test_scan_tu_refuses(text: str, reason: str) -> None:
    result = scan_tu(text)
    assert isinstance(result, str) and reason in result, result


def test_scan_tu_blanks_includes_and_lists_macros_and_names() -> None:
    text = (
        "#include <torch/extension.h>\n"
        '#include "cuda_runtime.h" // the runtime\n'
        "#define BLOCK 256\n"
        "#define CHECK(x) TORCH_CHECK(x, #x)\n"
        "/* #include <never.h> */\n"
        'const char* msg = "#include <not_either.h>";\n'
        "namespace { __device__ float helper(float v) { return v; } }\n"
        "namespace detail_ns { int inner(); }\n"
        "template <typename T> __global__ void k(T* x) {}\n"
        "enum Mode { kFast, kSlow };\n"
        "enum class Kind { A };\n"
        "typedef float real_t;\n"
        "struct Pair { int a; } pair_value;\n"
        "torch::Tensor f(torch::Tensor x);\n"
        "#undef BLOCK\n"
        "#undef TORCH_CHECK\n"
    )
    tu = scan_tu(text)
    assert isinstance(tu, TU)
    assert tu.includes == ("#include <torch/extension.h>", '#include "cuda_runtime.h" // the runtime')
    assert tu.body.split("\n")[:2] == ["", ""] and len(tu.body.split("\n")) == len(text.split("\n"))
    assert tu.macros == ("BLOCK", "CHECK", "TORCH_CHECK")
    expected = "helper detail_ns k Mode kFast kSlow Kind real_t Pair pair_value f msg"
    assert set(tu.names) == set(expected.split())


def test_mask_literals_keeps_lines_and_blanks_comments_and_strings() -> None:
    text = 'int a; // x "y"\nchar c = \'\\\'\'; /* a\nb */ const char* s = "q\\"";\n'
    masked = mask_literals(text)
    assert masked is not None and masked.count("\n") == text.count("\n") and len(masked) == len(text)
    assert "x" not in masked.split("\n")[0] and "'" in masked and "q" not in masked


def test_prepare_groups_by_flags_and_own_includes() -> None:
    a = prepare(
        unit("#include <torch/extension.h>\nint f();", "#include <torch/extension.h>\n__global__ void k(){}")
    )
    b = prepare(unit("#include <vector>\nint f();", "#include <cuda_runtime.h>\n__global__ void k(){}"))
    c = prepare(unit("int f();", "#include <cub/cub.cuh>\n__global__ void k(){}"))
    d = prepare(unit("int f();", "__global__ void k(){}", flags='[["extra_cuda_cflags", "[\'-O3\']"]]'))
    full = prepare(unit("int f();", "void g() { torch::nn::Linear lin(2, 2); }\n__global__ void k(){}"))
    groups = [p.group for p in (a, b, c, d, full)]  # type: ignore[union-attr]
    assert groups[0] == groups[1]  # headers the prelude already includes change nothing
    assert len(set(groups)) == 4
    assert isinstance(prepare(Unit("k", "e", "int f();", None, {})), str)
    assert isinstance(prepare(unit("int f();", functions={"a-b": "x"})), str)


# ---------------------------------------------------------------------------------------------- combined text
def test_compose_puts_each_call_in_its_namespace() -> None:
    first = prepare(
        unit("#include <vector>\n#define K 1\ntorch::Tensor f(torch::Tensor x);", "#define K 1\nint g;")
    )
    second = prepare(
        unit(
            "#define K 2\ntorch::Tensor f(torch::Tensor x);", "#define K 2\nint g;", functions={"f": "F doc"}
        )
    )
    second.unit.error_handling = False  # type: ignore[union-attr]
    mains, cuda = compose([first, second])  # type: ignore[list-item]
    assert cuda is not None and len(mains) == 1
    lines = mains[0].split("\n")
    assert lines[0] == "#include <vector>"
    assert lines.index('#line 1 "dice_b0/probe"') < lines.index("namespace dice_b0 {")
    assert "namespace f {}" in lines  # the probe of a name both declare
    assert (
        lines.index('#pragma push_macro("K")') < lines.index("namespace dice_b0 {") < lines.index("#undef K")
    )
    assert lines.index('#pragma pop_macro("K")') < lines.index("namespace dice_b1 {")
    assert 'm.def("f", torch::wrap_pybind_function(f), "f");' in lines
    assert 'm.def("f", f, "F doc");' in lines
    assert 'dice_b1::dice_bind_(m.def_submodule("b1"));' in lines
    assert mains[0].index("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)") > mains[0].index("namespace dice_b1 {")
    assert '#line 1 "dice_b1/cuda.cu"' in cuda and cuda.count("#undef K") == 2


def test_compose_gives_calls_with_other_cflags_their_own_binding_tu() -> None:
    items = [prepare(unit(f"int f{i}();", None, {f"f{i}": "d"})) for i in range(3)]
    mains, cuda = compose(items, [0, 1, 0])  # type: ignore[arg-type]
    assert cuda is None and len(mains) == 2
    assert "namespace dice_b1 { void dice_bind_(pybind11::module_ m); }" in mains[0]
    assert (
        'dice_b1::dice_bind_(m.def_submodule("b1"));' in mains[0] and "namespace dice_b1 {\n" not in mains[0]
    )
    assert "namespace dice_b1 {\n" in mains[1] and "PYBIND11_MODULE" not in mains[1]
    assert 'm.def("f1", torch::wrap_pybind_function(f1), "d");' in mains[1]


def test_own_pybind11_module_becomes_the_bind_function() -> None:
    cuda = (
        "#include <torch/extension.h>\ntorch::Tensor fwd(torch::Tensor x) { return x; }\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n  m.def("forward", &fwd, "fwd");\n}\n'
    )
    own = prepare(Unit("k", "my_ext", "torch::Tensor fwd(torch::Tensor x);", cuda, None))
    assert not isinstance(own, str) and own.cuda is not None and own.cuda.binds
    assert own.cuda.body.splitlines()[2] == "void dice_bind_(pybind11::module_ m) {"
    assert "dice_bind_" not in own.cuda.names
    mains, _ = compose([own])
    assert "void dice_bind_(pybind11::module_ m);" in mains[0] and 'm.def("forward"' not in mains[0]
    named = cuda.replace("TORCH_EXTENSION_NAME", "my_ext")
    assert not isinstance(prepare(Unit("k", "my_ext", "int g();", named, None)), str)
    assert isinstance(prepare(Unit("k", "other", "int g();", named, None)), str)  # its own import would fail
    assert isinstance(prepare(Unit("k", "my_ext", "int g();", cuda, {"forward": "f"})), str)  # two modules
    assert isinstance(prepare(Unit("k", "my_ext", "int g();", "int x;", None)), str)  # no module at all


def test_flags_are_normalized_as_torch_uses_them() -> None:
    flags = batchbuild._normalized(
        {
            "extra_cflags": ["-O3", " "],
            "extra_ldflags": ["", "-lcudart"],
            "with_cuda": None,
            "verbose": False,
        },
        "__global__ void k() {}",
    )
    assert flags == {"extra_cflags": ["-O3"], "verbose": False}
    assert batchbuild._normalized({"extra_ldflags": ["-lcudart"]}, None) == {"extra_ldflags": ["-lcudart"]}


@pytest.mark.parametrize(
    ("output", "blamed"),
    [
        ('dice_b3/cuda.cu(12): error: identifier "x" is undefined', {3}),
        ("dice_b1/main.cpp:4:10: error: 'foo' was not declared in this scope", {1}),
        ('dice_b2/probe(1): error: "relu" has already been declared in the current scope', {2}),
        (
            "/torch/include/ATen/core/TensorBody.h(300): error: no instance of overloaded function\n"
            "          detected during instantiation at line 9 of dice_b0/cuda.cu",
            {0},
        ),
        ("ptxas error   : Entry function '_ZN7dice_b312relu_kernelEPf' uses too much shared data", {3}),
        ("ImportError: x.so: undefined symbol: _ZN8dice_b101fEN2at6TensorE", {10}),
        (
            "main.o: in function `x': undefined reference to `dice_b4::f(at::Tensor)'\ncollect2: error: ld",
            {4},
        ),
        ("cc1plus: error: out of memory allocating 4096 bytes", None),
        ('1 error detected in the compilation of "cuda.cu".', None),
    ],
)
def test_attribute_blames_the_calls_messages_name(output: str, blamed: set[int] | None) -> None:
    assert attribute(output, 16) == blamed


# ---------------------------------------------------------------------------------------------- blame / split
def fake_calls(n: int) -> list[batchbuild.Call]:
    calls = []
    for i in range(n):
        call = batchbuild.Call(i, f"e{i}", "int f();", None, (), {}, key=f"key{i}")
        call.prepared = prepare(unit("int f();", key=f"key{i}"))  # type: ignore[assignment]
        calls.append(call)
    return calls


@pytest.mark.parametrize("blames", [True, False])
def test_build_group_leaves_out_the_bad_calls(monkeypatch: pytest.MonkeyPatch, blames: bool) -> None:
    calls = fake_calls(6)
    bad = {"key1", "key4"}
    attempts: list[list[str]] = []

    def combined(part: list[batchbuild.Call], cache_root: Path) -> tuple[bool, set[int], dict]:
        keys = [c.key for c in part]
        attempts.append(keys)
        hit = {i for i, k in enumerate(keys) if k in bad}
        return not hit, (hit if blames else set()), {"calls": len(part)}

    monkeypatch.setattr(batchbuild, "_build_combined", combined)
    batchbuild._build_group(calls, Path("/unused"), 0.0)
    status = {c.key: c.status for c in calls}
    if blames:  # one failed build, then the rest at once
        assert attempts == [[f"key{i}" for i in range(6)], ["key0", "key2", "key3", "key5"]]
        assert [k for k, s in status.items() if s == "batched"] == ["key0", "key2", "key3", "key5"]
        assert status["key1"] == status["key4"] == "failed"
    else:  # halves: [0 1 2] [3 4 5] -> [0] [1 2] ...: one call alone is left to its own build, not built
        assert attempts[1:3] == [["key0", "key1", "key2"], ["key3", "key4", "key5"]]
        assert all(len(a) > 1 for a in attempts) and set(status.values()) == {"alone"}


def test_discover_records_calls_without_building(tmp_path: Path) -> None:
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "ext = load_inline('e1', 'int f();', functions=['f'], extra_cflags=['-O2'])\n"
        "fn = ext.f\n"
        "value = ext.helper(3).shape\n"
        "other = load_inline(name='e2', cpp_sources=['int g();'], cuda_sources='__global__ void k(){}', "
        "functions='g')\n"
        "class ModelNew: pass\n"
    )
    calls = batchbuild.discover(src, tmp_path, 0)
    assert isinstance(calls, list) and [c.name for c in calls] == ["e1", "e2"]
    from dice.validator.builds import extension_key

    assert calls[0].key == extension_key(
        "e1", "int f();", None, (), {"functions": ["f"], "extra_cflags": ["-O2"]}
    )
    u = batchbuild.unit_of(calls[1])
    assert isinstance(u, Unit) and u.functions == {"g": "g"} and u.cuda == "__global__ void k(){}"
    assert batchbuild.unit_of(calls[0]).cflags == '["-O2"]'  # type: ignore[union-attr]
    assert isinstance(batchbuild.discover("raise ValueError('no')", tmp_path, 1), str)
    lazy = (
        "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
        "class ModelNew(torch.nn.Module):\n"
        "    def __init__(self, n):\n"
        "        super().__init__()\n"
        "        self.ext = load_inline(f'lazy_{n}', 'int f();', functions=['f'])\n"
        "        self.ext.f()\n"
    )
    ref = "def get_init_inputs():\n    return [7]\n"
    built = batchbuild.discover(lazy, tmp_path, 3, ref)
    assert isinstance(built, list) and [c.name for c in built] == ["lazy_7"]  # built in __init__
    own = batchbuild.discover(lazy + "def get_init_inputs():\n    return [8]\n", tmp_path, 4)
    assert isinstance(own, list) and [c.name for c in own] == ["lazy_8"]
    files = "import torch.utils.cpp_extension as c\nc.load('x', ['x.cpp'])\n"
    assert "cpp_extension.load" in str(batchbuild.discover(files, tmp_path, 2))
    import torch.utils.cpp_extension as cpp_extension

    assert cpp_extension.load_inline.__module__ == "torch.utils.cpp_extension"  # restored


def test_claim_skips_built_failed_and_busy_keys(tmp_path: Path) -> None:
    calls = fake_calls(5)
    for call in calls:
        call.cpp_sources, call.kwargs = "int f();", {"functions": ["f"]}
    ext = tmp_path / "torch_ext"
    (ext / "key0").mkdir(parents=True)
    (ext / "key0" / "x.so").write_text("")
    fastbuild.write_manifest(ext / "key0", ext / "key0" / "x.so")  # the builder's
    (ext / "key4").mkdir()
    (ext / "key4" / "x.so").write_text("")  # no manifest: not trusted, built again
    (ext / "key1").mkdir()
    fastbuild._record_failure(ext / "key1", "Error building: error: x", "error: x")
    (ext / "key2").mkdir()
    lock_file = str(ext / "key2" / ".dice-lock")
    hold = (
        f"import fcntl, os, time; fd = os.open({lock_file!r}, os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"
    )
    held = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)  # another task
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "held"
        todo = batchbuild._claim(calls, tmp_path)
    finally:
        held.kill()
    assert [c.key for c in todo] == ["key3", "key4"] and todo[0].lock is not None
    assert [c.status for c in calls] == ["cached", "failed", "alone", "alone", "alone"]
    assert "another task" in calls[2].reason
    for call in todo:
        call.lock.close()


# ---------------------------------------------------------------------------------------------- real builds
@pytest.fixture(scope="session")
def shared_pch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "dice-pch"  # the same folder test_fastbuild uses


def candidate(name: str, body: str, functions: str, extra: str = "") -> str:
    return (
        "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
        f"src = r'''{body}'''\n"
        f"ext = load_inline(name={name!r}, cpp_sources=src, functions={functions}{extra})\n"
        "forward = ext.forward\n"
        "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return ext.forward(x)\n"
    )


CANDIDATES = [
    candidate(
        "scale_ext",
        "#include <torch/extension.h>\n#include <vector>\n#define FACTOR 2\n"
        "torch::Tensor forward(torch::Tensor x) { return x * FACTOR; }\n",
        "['forward']",
    ),
    candidate(
        "scale_ext",  # the same name, function and macro, other values
        "#define FACTOR 3\nstatic int calls = 0;\n"
        "torch::Tensor forward(torch::Tensor x) { ++calls; return x * FACTOR; }\n"
        "int64_t count() { return calls; }\n",
        "{'forward': 'times three', 'count': 'calls so far'}",
    ),
    candidate("broken_ext", "torch::Tensor forward(torch::Tensor x) { return x +* 2; }\n", "['forward']"),
    candidate(  # other extra_cflags: the same batch, a binding TU of its own
        "offset_ext",
        "torch::Tensor forward(torch::Tensor x) { return x + DICE_OFFSET; }\n",
        "['forward']",
        ", extra_cflags=['-DDICE_OFFSET=5']",
    ),
]


@pytest.mark.slow
def test_batched_candidates_are_served_from_one_extension(
    tmp_path: Path, shared_pch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four C++-only candidates: one combined build fails on the broken one (blamed), the other three are
    built as one extension (the one with other extra_cflags in a binding TU of its own) and their own
    load_inline (same key) is served from it with exactly its functions."""
    import torch

    monkeypatch.setenv("DICE_PCH_DIR", str(shared_pch))
    cache = tmp_path / "cache"
    report = batchbuild.prebuild(cache, tmp_path, CANDIDATES)
    statuses = [c["status"] for c in report["candidates"]]
    assert statuses == ["batched", "batched", "failed", "batched"], json.dumps(report)
    assert [b["ok"] for b in report["builds"]] == [False, True] and report["builds"][0]["blamed"] == [2]
    assert report["builds"][1]["binding_tus"] == 2
    served = []
    for i in (0, 1, 3):
        src = CANDIDATES[i]
        records: list[dict] = []
        with cached_extension_builds(cache, records):
            module = import_source(src, tmp_path / f"cand{i}.py", f"dice_test_cand{i}")
        assert records[0]["batched"] and records[0]["key"] == report["candidates"][i]["keys"][0]
        assert records[0]["seconds"] < 5
        served.append(module.ext)
    first, second, third = served
    assert sorted(k for k in vars(first) if not k.startswith("__")) == ["forward"]
    assert sorted(k for k in vars(second) if not k.startswith("__")) == ["count", "forward"]
    x = torch.arange(3.0)
    assert torch.equal(first.forward(x), 2 * x) and torch.equal(second.forward(x), 3 * x)
    assert second.count() == 1 and second.forward.__doc__.strip().endswith("times three")
    assert first.__name__.startswith("scale_ext_") and first.__name__ != second.__name__
    assert torch.equal(third.forward(x), x + 5)
    broken_key = report["candidates"][2]["keys"][0]
    assert not (cache / "torch_ext" / broken_key / fastbuild.BATCH_FILE).exists()  # left to its own build


TWO_KERNELS = [
    (
        "#include <cuda_runtime.h>\n#define BLOCK 128\n"
        "__global__ void scale_kernel(const float* x, float* y, int n) {\n"
        "  int i = blockIdx.x * BLOCK + threadIdx.x; if (i < n) y[i] = 2.f * x[i];\n}\n"
        "torch::Tensor forward(torch::Tensor x) {\n  auto y = torch::empty_like(x); int n = x.numel();\n"
        "  scale_kernel<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);\n"
        "  return y;\n}\n"
    ),
    (
        "#include <torch/extension.h>\n#define BLOCK 256\n__constant__ float coef[2];\n"
        "__global__ void scale_kernel(const float* x, float* y, int n) {\n"
        "  int i = blockIdx.x * BLOCK + threadIdx.x; if (i < n) y[i] = coef[0] * x[i] + coef[1];\n}\n"
        "torch::Tensor forward(torch::Tensor x) {\n  auto y = torch::empty_like(x); int n = x.numel();\n"
        "  scale_kernel<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);\n"
        "  return y;\n}\n"
    ),
]


@pytest.mark.slow
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_combined_cuda_tu_with_clashing_kernels_compiles_with_nvcc(tmp_path: Path) -> None:
    """Two real-looking kernels with the same names and macro, combined as load_inline would write the .cu
    (torch/types.h first, then the slim text), compile with nvcc -c against this torch's headers."""
    import torch.utils.cpp_extension as cpp_extension

    items = [
        prepare(unit("torch::Tensor forward(torch::Tensor x);", cu, {"forward": "forward"}))
        for cu in TWO_KERNELS
    ]
    assert all(not isinstance(p, str) for p in items) and items[0].group == items[1].group  # type: ignore[union-attr]
    _, cuda = compose(items)  # type: ignore[arg-type]
    text = "\n".join(
        ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>", cuda or ""]
    )
    slim = buildtext.slim_cuda_text(text)
    assert slim is not None  # the combined text needs only torch/types.h, like each kernel's own
    (tmp_path / "cuda.cu").write_text(slim)
    includes = [arg for p in cpp_extension.include_paths() for arg in ("-isystem", p)]
    flags = list(cpp_extension.COMMON_NVCC_FLAGS) + ["-std=c++20", "-gencode=arch=compute_90,code=sm_90"]
    cmd = [str(nvcc_path()), *includes, *flags, "-DTORCH_EXTENSION_NAME=b", "-c", "cuda.cu", "-o", "cuda.o"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    symbols = subprocess.run(["nm", "-C", "cuda.o"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert "dice_b0::forward(at::Tensor)" in symbols and "dice_b1::forward(at::Tensor)" in symbols


def test_pool_prebuild_reports_without_building(cpu_pool) -> None:
    """The kb_prebuild task through the pool: candidates that cannot batch come back as "alone" (no build)."""
    lone = candidate("lone_ext", "int64_t forward(int64_t x) { return x; }\n", "['forward']")
    report = cpu_pool.submit_prebuild(["import nothing_here", "x = 1\n", lone]).result(timeout=300)
    statuses = [(c["index"], c["status"]) for c in report["candidates"]]
    assert statuses == [(0, "alone"), (1, "alone"), (2, "alone")], json.dumps(report)
    assert "discovery failed" in report["candidates"][0]["reason"]
    assert report["candidates"][1]["reason"] == "no load_inline call at import"
    assert report["candidates"][2]["reason"] == "no other call to batch it with" and report["builds"] == []


@pytest.mark.gpu
def test_gpu_prebuild_serves_kernelbench_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the device machine: three variants of the ReLU candidate and a broken one, prebuilt through the
    pool; the KernelBench tasks of the three are served from the batch and correct, the broken one gets its
    own compile error."""
    from dice.validator import ValidatorPool

    from .conftest import RELU_REF
    from .conftest import candidate as read

    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    marker = '_cuda_source = r"""\n'
    src = read("level1_19_relu.py")
    variants = [src.replace(marker, f"{marker}constexpr int dice_test_variant = {k};\n", 1) for k in range(3)]
    broken = variants[0].replace("y[i] = v > 0.f ? v : 0.f;", "y[i] = v > 0.f ? v : 0.f")
    assert broken != variants[0]
    with ValidatorPool(2, timeout_s=120, cache_verdicts=False) as pool:
        report = pool.submit_prebuild([*variants, broken]).result(timeout=900)
        statuses = [c["status"] for c in report["candidates"]]
        # the broken one is blamed ("failed") or split off by bisection and left to its own build ("alone",
        # seen on the H200): either way its own task compiles it alone and reports its own error
        assert statuses[:3] == ["batched"] * 3 and statuses[3] in ("failed", "alone"), json.dumps(report)
        futures = [pool.submit_kernelbench(RELU_REF, v, timing=False) for v in [*variants, broken]]
        verdicts = [f.result(timeout=900) for f in futures]
    assert [v.status for v in verdicts] == ["correct"] * 3 + ["compile_error"], [v.message for v in verdicts]
    assert all("[batched] (cached " in v.log.splitlines()[0] for v in verdicts[:3]), verdicts[0].log[:300]
