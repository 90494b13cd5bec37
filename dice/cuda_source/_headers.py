"""Which headers NVRTC can open, and the libcu++ twins of the C/C++ standard names device code uses (the
tables behind ``dice.cuda_source.device_code``'s header handling)."""

from __future__ import annotations

# Headers NVRTC opens given the CUDA include directory (device-side CUDA headers, libcu++, CUB, CUTLASS).
DEVICE_HEADERS = frozenset(
    {
        "cuda_fp16.h",
        "cuda_fp16.hpp",
        "cuda_bf16.h",
        "cuda_bf16.hpp",
        "cuda_fp8.h",
        "cuda_fp8.hpp",
        "cuda_fp6.h",
        "cuda_fp6.hpp",
        "cuda_fp4.h",
        "cuda_fp4.hpp",
        "mma.h",
        "cooperative_groups.h",
        "cuda_pipeline.h",
        "cuda_pipeline_primitives.h",
        "cuda_pipeline_helpers.h",
        "cuda_awbarrier.h",
        "cuda_awbarrier_primitives.h",
        "cuda_awbarrier_helpers.h",
        "curand_kernel.h",
        "math_constants.h",
        "vector_types.h",
        "vector_functions.h",
        "sm_20_intrinsics.h",
        "sm_30_intrinsics.h",
        "sm_32_intrinsics.h",
        "sm_35_intrinsics.h",
        "sm_61_intrinsics.h",
        "cuda_texture_types.h",
        "cuda_surface_types.h",
        "cuComplex.h",
        "library_types.h",
    }
)
DEVICE_HEADER_PREFIXES = ("cooperative_groups/", "cuda/", "cub/", "cute/", "cutlass/", "nv/", "crt/")
# C and C++ standard headers with a libcu++ twin that NVRTC can open.
LIBCUXX_TWINS = {
    **{
        name: name
        for name in (
            "array",
            "atomic",
            "bit",
            "bitset",
            "cassert",
            "cfloat",
            "climits",
            "cmath",
            "complex",
            "concepts",
            "cstddef",
            "cstdint",
            "cstdlib",
            "cstring",
            "functional",
            "limits",
            "numbers",
            "numeric",
            "optional",
            "ratio",
            "span",
            "tuple",
            "type_traits",
            "utility",
            "variant",
        )
    },
    "stdint.h": "cstdint",
    "float.h": "cfloat",
    "limits.h": "climits",
    "math.h": "cmath",
    "stddef.h": "cstddef",
    "stdlib.h": "cstdlib",
    "string.h": "cstring",
    "assert.h": "cassert",
}
# `namespace cuda { namespace std {} }` first: <cuda/std/cfloat> and <cuda/std/climits> are macros only.
STD_ALIAS = "namespace cuda { namespace std {} } namespace std { using namespace cuda::std; }"
# CUDA's global max/min overloads (always visible in device code) for code written against <algorithm>.
STD_MINMAX = "namespace std { using ::max; using ::min; }"
# POSIX constants <math.h> gives under nvcc but libcu++ does not define.
MATH_MACROS = {
    "M_PI": "3.14159265358979323846",
    "M_PI_2": "1.57079632679489661923",
    "M_PI_4": "0.78539816339744830962",
    "M_1_PI": "0.31830988618379067154",
    "M_2_PI": "0.63661977236758134308",
    "M_2_SQRTPI": "1.12837916709551257390",
    "M_SQRT2": "1.41421356237309504880",
    "M_SQRT1_2": "0.70710678118654752440",
    "M_E": "2.7182818284590452354",
    "M_LN2": "0.69314718055994530942",
    "M_LN10": "2.30258509299404568402",
    "M_LOG2E": "1.4426950408889634074",
    "M_LOG10E": "0.43429448190325182765",
}
# <cstdint> puts the fixed-width types in the global namespace too; kernels use them unqualified.
GLOBAL_INT_TYPES = (
    "using cuda::std::int8_t; using cuda::std::int16_t; using cuda::std::int32_t; "
    "using cuda::std::int64_t; using cuda::std::uint8_t; using cuda::std::uint16_t; "
    "using cuda::std::uint32_t; using cuda::std::uint64_t; using cuda::std::intptr_t; "
    "using cuda::std::uintptr_t;"
)

# Typedefs of <sys/types.h>, which nvcc's host headers make visible and NVRTC does not have.
HOST_TYPEDEFS = {
    "uint": "typedef unsigned int uint;",
    "ushort": "typedef unsigned short ushort;",
    "ulong": "typedef unsigned long ulong;",
    "u_char": "typedef unsigned char u_char;",
    "u_short": "typedef unsigned short u_short;",
    "u_int": "typedef unsigned int u_int;",
    "u_long": "typedef unsigned long u_long;",
}

# What makes a standard header needed by the device code (besides any use of namespace std).
_INT_TYPES = frozenset(
    {f"{u}int{n}_t" for u in ("", "u") for n in (8, 16, 32, 64)}
    | {"intptr_t", "uintptr_t", "intmax_t", "uintmax_t"}
)
_TWIN_NAMES = {
    "cstdint": _INT_TYPES,
    "cmath": frozenset({"INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "FP_NAN", "FP_INFINITE"}),
    "climits": frozenset(
        {
            "CHAR_BIT",
            "SCHAR_MIN",
            "SCHAR_MAX",
            "UCHAR_MAX",
            "CHAR_MIN",
            "CHAR_MAX",
            "SHRT_MIN",
            "SHRT_MAX",
            "USHRT_MAX",
            "INT_MIN",
            "INT_MAX",
            "UINT_MAX",
            "LONG_MIN",
            "LONG_MAX",
            "ULONG_MAX",
            "LLONG_MIN",
            "LLONG_MAX",
            "ULLONG_MAX",
        }
    ),
    "cstddef": frozenset({"ptrdiff_t", "max_align_t"}),
}
# Twins chosen by what the code uses; any other twin (<array>, <tuple>...) is kept when `std` is used.
BY_USAGE = frozenset({"cstdint", "cmath", "climits", "cfloat", "cstddef", "limits", "type_traits", "utility"})
_TWIN_PREFIXES = {
    "cstdint": (
        "INT8_",
        "INT16_",
        "INT32_",
        "INT64_",
        "UINT8_",
        "UINT16_",
        "UINT32_",
        "UINT64_",
        "INTPTR_",
        "UINTPTR_",
        "SIZE_MAX",
    ),
    "cfloat": ("FLT_", "DBL_", "LDBL_"),
}
_CMATH_FUNCTIONS = frozenset(
    {
        "sqrt",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "pow",
        "fabs",
        "abs",
        "floor",
        "ceil",
        "round",
        "trunc",
        "tanh",
        "tan",
        "sin",
        "cos",
        "sinh",
        "cosh",
        "asin",
        "acos",
        "atan",
        "atan2",
        "erf",
        "erfc",
        "fmax",
        "fmin",
        "fma",
        "isinf",
        "isnan",
        "isfinite",
        "cbrt",
        "hypot",
        "copysign",
        "signbit",
        "fmod",
        "lgamma",
        "tgamma",
        "rint",
        "nearbyint",
    }
)
_TYPE_TRAITS = frozenset(
    {
        "is_same",
        "enable_if",
        "enable_if_t",
        "conditional",
        "conditional_t",
        "is_floating_point",
        "is_integral",
        "is_signed",
        "is_unsigned",
        "remove_cv",
        "remove_reference",
        "decay",
        "is_same_v",
        "integral_constant",
        "true_type",
        "false_type",
        "remove_cv_t",
        "decay_t",
        "is_arithmetic",
    }
)
_UTILITY = frozenset({"swap", "pair", "make_pair", "move", "forward", "declval", "exchange"})
# Byte strings whose absence means no standard header can be needed (a cheap test before walking names).
TRIGGER_WORDS = (
    b"std",
    b"INFINITY",
    b"NAN",
    b"HUGE_VAL",
    b"int8_t",
    b"int16_t",
    b"int32_t",
    b"int64_t",
    b"intptr_t",
    b"FLT_",
    b"DBL_",
    b"_MAX",
    b"_MIN",
    b"CHAR_BIT",
    b"M_",
    b"uint",
    b"ushort",
    b"ulong",
    b"u_char",
    b"u_short",
    b"u_long",
)


def twins_needed(used: set[str]) -> set[str]:
    """libcu++ twins (``cmath``, ``cstdint``...) that code using the identifiers ``used`` needs."""
    needed: set[str] = set()
    for twin, names in _TWIN_NAMES.items():
        if names & used:
            needed.add(twin)
    for twin, prefixes in _TWIN_PREFIXES.items():
        if any(name.startswith(prefixes) for name in used):
            needed.add(twin)
    if "numeric_limits" in used:
        needed.add("limits")
    if "std" in used:
        if _CMATH_FUNCTIONS & used:
            needed.add("cmath")
        if _TYPE_TRAITS & used:
            needed.add("type_traits")
        if _UTILITY & used:
            needed.add("utility")
    return needed
