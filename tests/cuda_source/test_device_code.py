"""Device-code extraction: what is kept and dropped, the line map, and real NVRTC compiles (no GPU needed)."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dice.cuda_source import extract_device_code, parse_document, splice

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CU_EXAMPLES = ["vector_add.cu", "softmax_rows.cu", "tiled_matmul.cu"]


def nvrtc_include_dirs() -> list[str]:
    """CUDA headers from the pip CUDA runtime (or a toolkit) and libcu++ as CuPy ships it."""
    dirs: list[str] = []
    for base in sys.path:
        for candidate in (
            Path(base) / "nvidia" / "cu13" / "include",
            Path(base) / "nvidia" / "cuda_runtime" / "include",
            Path(base) / "cupy" / "_core" / "include" / "cupy" / "_cccl" / "libcudacxx",
        ):
            if candidate.is_dir() and str(candidate) not in dirs:
                dirs.append(str(candidate))
    if Path("/usr/local/cuda/include").is_dir():
        dirs.append("/usr/local/cuda/include")
    return dirs


def nvrtc_compile(source: str) -> tuple[bool, str]:
    """Compile with the bare NVRTC binding (works without a GPU); returns (ok, log)."""
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    options = ["--gpu-architecture=compute_90", "-std=c++17"] + [f"-I{d}" for d in nvrtc_include_dirs()]
    program = nvrtc.createProgram(source, "candidate.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, options)
            return True, nvrtc.getProgramLog(program)
        except Exception:
            return False, nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)


def test_nvrtc_really_rejects_host_code() -> None:
    """The premise of the extractor: NVRTC refuses host functions and host headers."""
    ok, log = nvrtc_compile("#include <vector>\n__global__ void k() {}\n")
    assert not ok and "vector" in log
    ok, log = nvrtc_compile("int main() { return 0; }\n__global__ void k() {}\n")
    assert not ok and "host function" in log


@pytest.mark.parametrize("name", CU_EXAMPLES)
@pytest.mark.parametrize("variant", ["examples", "solutions"])
def test_examples_device_code_compiles_with_nvrtc(name: str, variant: str) -> None:
    path = EXAMPLES / name if variant == "examples" else EXAMPLES / "solutions" / name
    device = extract_device_code(path.read_text())
    ok, log = nvrtc_compile(device.source)
    assert ok, log


def test_tiled_matmul_host_code_is_removed_and_lines_map_back() -> None:
    text = (EXAMPLES / "tiled_matmul.cu").read_text()
    device = extract_device_code(text)
    assert device.has_host_code
    for host_only in ("int main", "<<<", "cudaMalloc(&", "std::vector", "host_dot", "#include <vector>"):
        assert host_only not in device.source
    assert set(device.dropped_includes) == {"cstdio", "cstdlib", "cmath", "vector", "cuda_runtime.h"}
    original = text.splitlines()
    for out_line, origin in zip(device.source.splitlines(), device.line_map, strict=True):
        assert out_line == original[origin]
    assert "__global__ void tiled_matmul(" in device.source


def test_compiler_errors_map_to_the_users_line() -> None:
    text = (EXAMPLES / "softmax_rows.cu").read_text()
    mask = parse_document(text).masks[1]
    broken = splice(text, {1: "y_row[threadIdx.x] = undefined_name;"}).text
    device = extract_device_code("#include <vector>\nint helper() { return 1; }\n" + broken)
    ok, log = nvrtc_compile(device.source)
    assert not ok
    match = re.search(r"candidate\.cu\((\d+)\): error: identifier \"undefined_name\" is undefined", log)
    assert match, log
    assert device.original_line(int(match.group(1)) - 1) == mask.range.start.line + 2


def test_kept_and_dropped_items() -> None:
    text = """#include <cuda_fp16.h>
#include "my_helpers.cuh"
#include <iostream>
#include <cstdint>
#include <cooperative_groups.h>
#define BLOCK 128
#define DEV __device__ __forceinline__
typedef float real;
using index_t = int;
struct Pair { float a, b; };
enum class Mode { kFast, kExact };
constexpr int kTile = 16;
static const float kScale = 0.5f;
__constant__ float weights[BLOCK];
__device__ int counter;
std::vector<float> host_buffer;
int host_counter = 0;
void launch(float* x, int n);
__global__ void k(float* x, int n);
constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }
DEV float twice(float v) { return 2.0f * v; }
template <typename T> __device__ T square(T v) { return v * v; }
template <typename T> T host_square(T v) { return v * v; }
using namespace std;
namespace cg = cooperative_groups;
namespace ops {
  __device__ float inc(float v) { return v + 1.0f; }
  float host_inc(float v) { return v + 1.0f; }
}
extern "C" {
  __global__ void k2(int32_t* x) { x[0] = cdiv(3, 2); }
  void host_in_c() {}
}
#ifdef __CUDACC__
__global__ void k(float* x, int n) { if (n) x[0] = twice(square(weights[0])) * kScale; }
#else
int fallback() { return 0; }
#endif
int main() { float* d; cudaMalloc(&d, 4); k<<<1, 1>>>(d, 1); }
"""
    device = extract_device_code(text)
    kept = [
        "#include <cuda_fp16.h>",
        '#include "my_helpers.cuh"',
        "#include <cuda/std/cstdint>",
        "#define BLOCK 128",
        "typedef float real;",
        "using index_t = int;",
        "struct Pair",
        "enum class Mode",
        "constexpr int kTile = 16;",
        "static const float kScale = 0.5f;",
        "__constant__ float weights",
        "__device__ int counter;",
        "__global__ void k(float* x, int n);",
        "__host__ __device__ constexpr int cdiv",
        "DEV float twice",
        "template <typename T> __device__ T",
        "namespace cg = cooperative_groups;",
        "__device__ float inc",
        "__global__ void k2",
        "#ifdef __CUDACC__",
        "#else",
        "#endif",
        "using cuda::std::int32_t;",
    ]
    dropped = [
        "<iostream>",
        "host_buffer",
        "host_counter",
        "void launch",
        "host_square",
        "using namespace std;",
        "host_inc",
        "host_in_c",
        "int fallback",
        "int main",
        "cudaMalloc",
        "<<<",
    ]
    for piece in kept:
        assert piece in device.source, piece
    for piece in dropped:
        assert piece not in device.source, piece
    assert device.dropped_includes == ("iostream",)
    assert device.has_host_code
    # the namespace and extern "C" braces survive around what they keep
    assert "namespace ops {" in device.source and 'extern "C" {' in device.source
    ok, log = nvrtc_compile(extract_device_code(text.replace('#include "my_helpers.cuh"\n', "")).source)
    assert ok, log


def test_device_only_file_is_unchanged_and_flags_no_host_code() -> None:
    text = "#define N 4\n\n__global__ void k(float* x) {\n    x[0] = N;\n}\n"
    device = extract_device_code(text)
    assert device.source == text
    assert device.line_map == [0, 1, 2, 3, 4]
    assert not device.has_host_code


def test_extraction_never_raises_on_broken_input() -> None:
    for text in (
        "",
        "}}}",
        "__global__ void k( {",
        "int main() {",
        "\x00\xff junk <<<>>>",
        "#include <",
        "template <typename T",
    ):
        device = extract_device_code(text)
        assert len(device.line_map) == len(device.source.splitlines())


def test_kernelbench_solution_cuda_string_device_part_compiles() -> None:
    """The device half of the KernelBench solution's load_inline source compiles; the file is not run."""
    module = ast.parse((EXAMPLES / "solutions" / "kernelbench_softmax.py").read_text())
    sources = {
        target.id: node.value.value
        for node in module.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    device = extract_device_code(sources["softmax_source"])
    assert device.has_host_code  # the torch wrapper with its <<<>>> launch
    assert "torch::Tensor" not in device.source
    ok, log = nvrtc_compile(device.source)
    assert ok, log


class _TorchArgs:
    """Wraps a CuPy RawModule so kernels accept torch CUDA tensors (zero-copy views), as the dice-spec
    contract promises; kept local so this test checks the examples, not the validator."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def get_function(self, name: str) -> Callable[..., None]:
        import cupy
        import torch

        kernel = self._module.get_function(name)

        def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **kw: Any) -> None:
            views = tuple(cupy.from_dlpack(a.detach()) if isinstance(a, torch.Tensor) else a for a in args)
            kernel(grid, block, views, **kw)

        return launch


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["vector_add.cu", "softmax_rows.cu"])
def test_example_specs_pass_with_the_solution_and_fail_with_holes(name: str, monkeypatch) -> None:
    """On a GPU: each spec's launch() with the solution matches reference(); the unfilled example does not.

    The specs allocate their outputs with ``torch.empty_like``, whose memory may be a block the caching
    allocator freed a moment ago, holding the previous variant's (correct) result: the holed kernel, which
    writes nothing, would then read as correct. Outputs are made NaN-filled here, so the outcome depends
    only on what each kernel writes, never on allocator reuse.
    """
    import cupy
    import torch

    empty_like = torch.empty_like

    def poisoned_empty_like(t: Any, *args: Any, **kwargs: Any) -> Any:
        return empty_like(t, *args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty_like", poisoned_empty_like)
    outcomes = {}
    for variant in ("solutions", "examples"):
        text = (EXAMPLES / variant / name if variant == "solutions" else EXAMPLES / name).read_text()
        doc = parse_document(text)
        kernels = [f.name for f in doc.functions if f.kind == "global"]
        raw = cupy.RawModule(
            code=extract_device_code(text).source, options=("-std=c++17",), name_expressions=kernels
        )
        namespace: dict[str, Any] = {"__name__": "dice_spec"}
        exec(compile(doc.spec.source, f"{name} (dice-spec)", "exec"), namespace)  # the example's own spec
        inputs = namespace["inputs"]()
        expected = namespace["reference"](*inputs)
        got = namespace["launch"](_TorchArgs(raw), *inputs)
        torch.cuda.synchronize()
        outcomes[variant] = torch.allclose(
            got, expected, atol=namespace.get("atol", 1e-2), rtol=namespace.get("rtol", 1e-2)
        )
    assert outcomes == {"solutions": True, "examples": False}


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ("x[0] = INFINITY + M_PI;", "#include <cuda/std/cmath>"),
        ("int64_t i = n; x[0] = (float)i;", "using cuda::std::int64_t;"),
        ("x[0] = std::max(x[1], x[2]) + std::sqrt(x[3]);", "using ::max;"),
        ("x[0] = std::numeric_limits<float>::lowest();", "#include <cuda/std/limits>"),
        ("x[0] = FLT_MAX;", "#include <cuda/std/cfloat>"),
    ],
)
def test_standard_names_that_nvcc_makes_visible_compile_under_nvrtc(body: str, expect: str) -> None:
    """torch/extension.h (or nvcc's implicit <math.h>) makes these visible; NVRTC needs libcu++ twins."""
    text = (
        f"#include <torch/extension.h>\n\n__global__ void k(float* x, int n) {{\n    {body}\n}}\n"
        "torch::Tensor run(torch::Tensor x) { return x; }\n"
    )
    device = extract_device_code(text)
    assert expect in device.source
    assert "torch" not in device.source
    kernel_line = device.source.splitlines().index(f"    {body}")
    assert device.line_map[kernel_line] == 3
    ok, log = nvrtc_compile(device.source)
    assert ok, log


def test_host_only_std_use_adds_no_headers() -> None:
    text = (
        "#include <cstdio>\n#include <cmath>\n__global__ void k(float* x) { x[0] = expf(x[1]); }\n"
        'int main() { std::printf("%f", std::sqrt(2.0)); }\n'
    )
    device = extract_device_code(text)
    assert "#include" not in device.source
    assert set(device.dropped_includes) == {"cstdio", "cmath"}


def test_real_kernelbench_cuda_sources_compile_after_extraction(shared_data: Path) -> None:
    """load_inline CUDA strings from the KernelBench PR 67 SFT set (torch/extension.h, host wrappers with
    <<<>>> launches): the extracted device code compiles with NVRTC."""
    pq = pytest.importorskip("pyarrow.parquet")
    path = shared_data / "kernelbench-pr67-dsr1" / "sft_dataset_best_4_eval.parquet"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    sources = []
    for row in pq.read_table(path).to_pylist():
        match = re.search(r"```python\n(.*?)```", row["answer"], re.S)
        try:
            module = ast.parse(match.group(1) if match else row["answer"])
        except SyntaxError:
            continue
        sources += [
            node.value
            for node in ast.walk(module)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "__global__" in node.value
            and not parse_document(node.value).has_errors
        ]  # a few answers are cut off mid-kernel
    assert len(sources) >= 12
    failures = []
    for source in sources[:: max(1, len(sources) // 12)][:12]:
        device = extract_device_code(source)
        assert device.has_host_code and "<<<" not in device.source
        ok, log = nvrtc_compile(device.source)
        if not ok:
            failures.append(log[:400])
    assert not failures, failures


def test_host_members_of_classes_are_removed() -> None:
    text = """#include <vector>
typedef struct { int n; int get() const { return n; } } P;
template <class T> struct Q {
    T v;
    Q() = default;
    explicit Q(T x) : v(x) {}
    T get() { return v; }
    __device__ T dget() const { return v; }
    template <class U> U conv() { return U(v); }
    template <class U> __device__ U dconv() const { return U(v); }
    static Q make(T x);
    __host__ __device__ int size() const;
    struct In { int z; int f() { return z; } __device__ int g() const { return z; } };
    constexpr int width() const { return 4; }
};
struct Launcher { std::vector<int> dims; void run(); };
typedef struct { torch::Tensor t; } Holder;
__global__ void k(P p, Q<float> q, Q<float>::In in, int* o) {
    o[0] = p.n + (int)q.dget() + q.dconv<int>() + in.g() + q.width();
}
"""
    device = extract_device_code(text)
    for gone in (" get()", "explicit Q", " conv()", "make(", " f()", "Launcher", "Holder", "torch"):
        assert gone not in device.source, gone
    for kept in (
        "Q() = default;",
        "__device__ T dget()",
        "__device__ U dconv()",
        "int size() const;",
        "__device__ int g()",
        "__host__ __device__ constexpr int width()",
        "struct In { int z;",
    ):
        assert kept in device.source, kept
    ok, log = nvrtc_compile(device.source)
    assert ok, log


# Namespace-scope items, each whole lines; {i} makes names unique.
DEVICE_ITEMS = [
    "__global__ void k{i}(float* x, int n) {{\n    int j = threadIdx.x; // é 😀\n"
    "    if (j < n) x[j] = {i};\n}}\n",
    "__device__ __forceinline__ float d{i}(float v) {{ return v * {i}.0f; }}\n",
    "template <typename T>\n__device__ T t{i}(T v) {{\n    return v;\n}}\n",
    "#define M{i} ({i} + 1)\n",
    "__constant__ float c{i}[4];\n",
    "struct S{i} {{\n    float a;\n    __device__ float get() const {{ return a; }}\n}};\n",
    "// comment {i} ü\n",
    "\n",
]
HOST_ITEMS = [
    "int main{i}() {{\n    float* d;\n    cudaMalloc(&d, 4);\n    k0<<<1, 1>>>(d, 1);\n    return 0;\n}}\n",
    "void launch{i}(float* x) {{\n    k0<<<1, 32>>>(x, 32);\n}}\n",
    "static std::vector<float> buffer{i};\n",
    "#include <vector>\n",
    "torch::Tensor forward{i}(torch::Tensor x);\n",
]


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 4)), max_size=14),
    st.sampled_from(["\n", "\r\n"]),
)
@settings(max_examples=80, deadline=None)
def test_generated_files_keep_device_items_verbatim_with_exact_lines(
    plan: list[tuple[bool, int, int]], newline: str
) -> None:
    items = [
        (DEVICE_ITEMS[d].format(i=n) if device else HOST_ITEMS[h].format(i=n), device)
        for n, (device, d, h) in enumerate(plan)
    ]
    text = "".join(item for item, _ in items).replace("\n", newline)
    device = extract_device_code(text)
    original = text.replace("\r\n", "\n").split("\n")
    out = device.source.split("\n")[:-1] if device.source else []
    assert len(out) == len(device.line_map)
    # Every output line is its original line (nothing here shares a line with dropped code).
    for line, origin in zip(out, device.line_map, strict=True):
        assert line == original[origin]
    # Device items survive whole and in order; host items vanish.
    kept_text = "\n".join(out)
    for item, is_device in items:
        body = item.strip("\n")
        if not body:
            continue
        if is_device:
            assert body in kept_text
        else:
            assert body.splitlines()[0] not in kept_text
    assert device.has_host_code == any(not is_device and "#include" not in item for item, is_device in items)
