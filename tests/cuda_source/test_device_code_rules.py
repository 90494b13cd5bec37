"""Device-code extraction rules found on real projects: explicit instantiations of dropped templates, host
globals of types device code cannot use, host-header typedefs, and items that unexpanded macros split."""

from __future__ import annotations

import pytest

from dice.cuda_source import extract_device_code


def nvrtc_ok(source: str) -> tuple[bool, str]:
    compile_module = pytest.importorskip("dice.validator.compile")
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    result = compile_module.nvrtc_compile(source)
    return result.ok, result.log


def assert_pieces(source: str, kept: list[str], dropped: list[str]) -> None:
    for piece in kept:
        assert piece in source, piece
    for piece in dropped:
        assert piece not in source, piece


# ------------------------------------------------------------------------------ explicit instantiations


INSTANTIATIONS = """#include <vector>
template <typename T> void host_fill(T* x, int n) { for (int i = 0; i < n; ++i) x[i] = T(0); }
template void host_fill<float>(float*, int);
template void host_fill(double*, int);
extern template void host_fill<int>(int*, int);
template <> void host_fill<char>(char* x, int n) { }
template <typename T> __global__ void scale(T* x, T a) { x[threadIdx.x] *= a; }
template __global__ void scale<float>(float*, float);
extern template __global__ void scale<int>(int*, int);
template <typename T> struct HostBox { std::vector<T> items; };
template struct HostBox<float>;
template <> struct HostBox<int> { int n; };
template <typename T> struct DevBox { T v; __device__ T get() const { return v; } };
template struct DevBox<float>;
template <> struct DevBox<char> { char v; };
namespace ns {
template <typename T> T host_twice(T v) { return v + v; }
}
template float ns::host_twice<float>(float);
template float ns::host_twice(float);
"""


def test_explicit_instantiations_of_dropped_templates_are_dropped() -> None:
    device = extract_device_code(INSTANTIATIONS)
    assert_pieces(
        device.source,
        kept=[
            "template <typename T> __global__ void scale",
            "template __global__ void scale<float>(float*, float);",
            "extern template __global__ void scale<int>(int*, int);",
            "template struct DevBox<float>;",
            "template <> struct DevBox<char> { char v; };",
        ],
        dropped=[
            "host_fill",
            "HostBox",
            "host_twice",
        ],
    )
    assert device.has_host_code
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_instantiations_of_templates_defined_elsewhere_are_kept() -> None:
    """A template from a header may be a device template: its instantiation is not ours to judge."""
    text = '#include "kernels.cuh"\ntemplate __global__ void from_header<float>(float*);\n'
    assert "template __global__ void from_header<float>(float*);" in extract_device_code(text).source


def test_a_name_with_a_device_and_a_host_template_keeps_its_instantiations() -> None:
    text = (
        "template <typename T> __device__ T pick(T v) { return v; }\n"
        "template <typename T> T pick(T v, int) { return v; }\n"
        "template __device__ float pick<float>(float);\n"
    )
    device = extract_device_code(text)
    assert "template __device__ float pick<float>(float);" in device.source
    assert "T pick(T v, int)" not in device.source


# ------------------------------------------------------------------------------------------ host globals


def test_host_globals_of_types_device_code_cannot_use_are_dropped() -> None:
    text = """const char* kNames[] = {"a", "b"};
static const char* kMessage = "m";
const char* const kName = "x";
constexpr const char* kLabel = "y";
const int& kRef = 4;
int (*kHook)(int) = nullptr;
const float kScale = 2.0f;
constexpr int kN = 4;
static const unsigned long long kBig = 1ull << 40;
const float kTable[2] = {1.0f, 2.0f};
__constant__ const float* kDevPtr;
__global__ void k(float* x) { x[0] = kScale * kN + kBig; }
"""
    device = extract_device_code(text)
    assert_pieces(
        device.source,
        kept=[
            "const float kScale = 2.0f;",
            "constexpr int kN = 4;",
            "static const unsigned long long kBig",
            "const float kTable[2]",
            "__constant__ const float* kDevPtr;",
        ],
        dropped=["kNames", "kMessage", "kName", "kLabel", "kRef", "kHook"],
    )
    assert device.has_host_code
    ok, log = nvrtc_ok(device.source)
    assert ok, log


# ----------------------------------------------------------------------------------- host-header typedefs


def test_sys_types_typedefs_are_defined_when_device_code_uses_them() -> None:
    text = (
        "#include <cstdio>\n__global__ void k(uint* x, ushort s, ulong l, u_char c) {\n"
        "    x[0] = s + (uint)l + c;\n}\n"
    )
    device = extract_device_code(text)
    for typedef in (
        "typedef unsigned int uint;",
        "typedef unsigned short ushort;",
        "typedef unsigned long ulong;",
        "typedef unsigned char u_char;",
    ):
        assert typedef in device.source
    # The added lines stand where the dropped include was.
    assert device.line_map[device.source.splitlines().index("typedef unsigned int uint;")] == 0
    ok, log = nvrtc_ok(device.source)
    assert ok, log


@pytest.mark.parametrize(
    "text",
    [
        "typedef unsigned int uint;\n__global__ void k(uint* x) { x[0] = 1; }\n",
        "using uint = unsigned int;\n__global__ void k(uint* x) { x[0] = 1; }\n",
        "#define uint unsigned int\n__global__ void k(uint* x) { x[0] = 1; }\n",
        "__global__ void k(unsigned* x) { x[0] = 1; }\nint main() { uint n = 3; return n; }\n",
        "__global__ void k(uint32_t* x) { x[0] = 1; }\n",
    ],
)
def test_no_typedef_when_defined_or_unused_by_device_code(text: str) -> None:
    typedef = "typedef unsigned int uint;"
    assert extract_device_code(text).source.count(typedef) == text.count(typedef)


# ---------------------------------------------------------------------- items that unexpanded macros split


def test_attribute_macros_before_a_dropped_host_prototype_go_with_it() -> None:
    """`GGML_NORETURN GGML_ATTRIBUTE_FORMAT(3, 4)` is an ERROR node of its own before the prototype."""
    text = """#define GGML_API
#define GGML_NORETURN
#define GGML_ATTRIBUTE_FORMAT(a, b)
extern "C" {
    GGML_NORETURN GGML_ATTRIBUTE_FORMAT(3, 4)
    GGML_API void ggml_abort(const char * file, int line, const char * fmt, ...);
    enum ggml_status { GGML_STATUS_OK = 0 };
}
__global__ void k(int* x) { x[0] = GGML_STATUS_OK; }
"""
    device = extract_device_code(text)
    assert "ggml_abort" not in device.source and "GGML_ATTRIBUTE_FORMAT(3, 4)" not in device.source
    assert "enum ggml_status" in device.source
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_qualifier_macro_split_from_its_member_function_keeps_it() -> None:
    """`MGPU_HOST_DEVICE value_type operator[](...)` parses as a field `MGPU_HOST_DEVICE value_type` missing
    its `;` and a function without specifiers: the two are one device member."""
    text = """#define MGPU_HOST_DEVICE __forceinline__ __device__ __host__
template <typename value_type>
struct iter_t {
  value_type* p;
  MGPU_HOST_DEVICE value_type operator[](int i) const { return p[i]; }
  MGPU_HOST_DEVICE value_type operator*() const { return p[0]; }
  value_type host_only() const { return p[0]; }
};
__global__ void k(iter_t<float> it, float* y) { y[0] = it[1] + *it; }
"""
    device = extract_device_code(text)
    assert "MGPU_HOST_DEVICE value_type operator[](int i) const" in device.source
    assert "MGPU_HOST_DEVICE value_type operator*() const" in device.source
    assert "host_only" not in device.source
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_host_function_after_a_macro_split_goes_whole() -> None:
    text = "#define API\nAPI value_type host_get(int i) { return i; }\n__global__ void k() {}\n"
    device = extract_device_code(text)
    assert "host_get" not in device.source and "API value_type" not in device.source


def test_cuda_library_device_headers_are_kept() -> None:
    text = (
        "#include <cuComplex.h>\n#include <library_types.h>\n#include <cublas_v2.h>\n"
        "__global__ void k(cuFloatComplex* z, cudaDataType t) { z[0] = cuCaddf(z[0], z[1]); }\n"
    )
    device = extract_device_code(text)
    assert "#include <cuComplex.h>" in device.source and "#include <library_types.h>" in device.source
    assert device.dropped_includes == ("cublas_v2.h",)
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_classes_holding_host_library_handles_are_dropped() -> None:
    text = (
        "#include <cublasLt.h>\nstruct Plan { cublasLtMatmulAlgo_t algo; cublasHandle_t handle; int n; };\n"
        "struct Dims { int m, n; };\n__global__ void k(Dims d, int* o) { o[0] = d.m; }\n"
    )
    device = extract_device_code(text)
    assert "Plan" not in device.source and "struct Dims" in device.source
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_macro_wrapped_host_prototypes_are_dropped() -> None:
    """`GGML_DEPRECATED(GGML_API double f(int t), "use g");`: the macro call and the prototype inside."""
    text = """#define GGML_API
#define GGML_DEPRECATED(func, hint) func
extern "C" {
    GGML_DEPRECATED(
    GGML_API double ggml_type_sizef(int type), // as float
    "use ggml_row_size() instead");
    GGML_API int ggml_other(void);
}
__global__ void k(int* x) { x[0] = 1; }
"""
    device = extract_device_code(text)
    assert_pieces(device.source, kept=["__global__ void k"], dropped=["ggml_type_sizef", "use ggml_row_size"])
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_namespace_macros_do_not_hide_the_items_between_them() -> None:
    text = """#include <exception>
#define BEGIN_NS namespace mgpu {
#define END_NS }
BEGIN_NS
__device__ int one() { return 1; }
END_NS

BEGIN_NS

struct cuda_exception_t : std::exception {
  int result;
};
int host_count() { return 2; }
__device__ int two() { return 2; }

END_NS
__global__ void k(int* x) { x[0] = mgpu::one() + mgpu::two(); }
"""
    device = extract_device_code(text)
    assert_pieces(
        device.source,
        kept=["BEGIN_NS", "END_NS", "__device__ int two()"],
        dropped=["cuda_exception_t", "host_count"],
    )
    assert device.source.count("BEGIN_NS") == 3 and device.source.count("END_NS") == 3
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_launch_bounds_macros_and_lambda_macros_keep_kernels_and_drop_host_code() -> None:
    text = """#define LB(n) __launch_bounds__(n)
#define MGPU_DEVICE __device__
#define ALIGN(n) __align__(n)
template <int nt>
__global__ LB(nt)
void tiled(float* x) { x[threadIdx.x] = nt; }
__global__ void LB(128) flat(float* x) { x[0] = 1; }
struct ALIGN(8) dim_t {
  int nt;
  int host_size() const { return nt; }
  __device__ int size() const { return nt; }
};
template <typename f_t> void launch(f_t f) { f(0); }
template <int nt>
void host_reduce(float* x) {
  auto k = [=] MGPU_DEVICE(int tid) { x[tid] = 0; };
  launch(k);
}
template void host_reduce<128>(float*);
template __global__ void tiled<64>(float*);
"""
    device = extract_device_code(text)
    assert_pieces(
        device.source,
        kept=[
            "__global__ LB(nt)\nvoid tiled(",
            "__global__ void LB(128) flat(",
            "__device__ int size()",
            "tiled<64>",
        ],
        dropped=["host_size", "host_reduce", "MGPU_DEVICE(int tid)", "void launch("],
    )
    ok, log = nvrtc_ok(device.source)
    assert ok, log


def test_a_declaration_tree_sitter_cannot_read_is_left_to_nvrtc() -> None:
    text = (
        "template <int i, typename... a_t> struct impl;\n"
        "template <int i, typename h_t, typename... a_t>\n"
        "struct impl<i, h_t, a_t...> : leaf<i, h_t>, impl<i + 1, a_t...> {\n"
        "  __device__ impl(int x) : leaf<i, h_t>(x) { }\n};\n"
    )
    assert "struct impl<i, h_t, a_t...>" in extract_device_code(text).source


def test_the_first_include_of_a_standard_header_gets_its_twin() -> None:
    text = "#include <stdint.h>\n__global__ void k(int64_t* x) { x[0] = 1; }\n#include <stdint.h>\n"
    device = extract_device_code(text)
    assert device.source.splitlines()[0] == "#include <cuda/std/cstdint>"
    assert device.source.count("#include <cuda/std/cstdint>") == 1


def test_project_headers_in_angle_brackets_are_kept_when_named() -> None:
    text = "#include <moderngpu/transform.hxx>\n#include <vector>\n__global__ void k() {}\n"
    assert "<moderngpu/transform.hxx>" not in extract_device_code(text).source
    kept = extract_device_code(text, project_headers={"moderngpu/transform.hxx"})
    assert "#include <moderngpu/transform.hxx>" in kept.source and kept.dropped_includes == ("vector",)
