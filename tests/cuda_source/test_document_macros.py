"""Masks and syntax errors around the preprocessor: masks in macro strings, malformed masks reported, syntax
errors that unexpanded macros explain, and FunctionInfo.is_template."""

from __future__ import annotations

import pytest

from dice.cuda_source import MalformedMask, Position, Range, encode_text, function_at, parse_document

# ------------------------------------------------------------------------------- masks in macro strings


@pytest.mark.parametrize(
    "text",
    [
        '#define S "/* <MASK> */"\n__global__ void k() {}\n',
        '#define LOG(x) printf("/* <MASK> */ %d", x)\n',
        '#define LOG(x) \\\n    printf("a" "/* <MASK:8> */", x)\n',
        "#define C '/' \"/* <MASK> */\"\n",
        '  #  define S u8"/* <MASK> */"\n',
        '#define S R"(/* <MASK> */)"\n',
        '#define S "\\" /* <MASK> */"\n',
    ],
)
def test_masks_inside_string_literals_of_macro_bodies_are_not_masks(text: str) -> None:
    doc = parse_document(text)
    assert doc.masks == []
    assert doc.malformed_masks == []


def test_comments_in_macro_bodies_and_code_after_them_still_hold_masks() -> None:
    text = (
        '#define S "a" /* <MASK> */ "b"\n'
        '#define T "x"\n'
        "__global__ void k(float* x) {\n    /* <MASK:4> */\n}\n"
    )
    doc = parse_document(text)
    assert [(m.range.start.line, m.budget) for m in doc.masks] == [(0, None), (3, 4)]
    assert doc.masks[1].function == "k"


def test_a_directive_inside_a_comment_is_not_a_macro() -> None:
    text = '/*\n#define S "x\n*/\n__global__ void k() {\n    /* <MASK> */ const char* s = "\\"";\n}\n'
    (mask,) = parse_document(text).masks
    assert mask.function == "k"


# ------------------------------------------------------------------------------------------ malformed


@pytest.mark.parametrize(
    ("comment", "reason"),
    [
        ("/* <MASK:0> */", "a budget must be a positive integer, got 0"),
        ("/* <MASK: 0> */", "a budget must be a positive integer, got 0"),
        ("/* <MASK:abc> */", "a budget must be a positive integer, got abc"),
        ("/* <MASK:-3> */", "a budget must be a positive integer, got -3"),
        ("/* <MASK:1.5> */", "a budget must be a positive integer, got 1.5"),
        ("/* <MASK: > */", "a budget must be a positive integer, got nothing"),
        ("// <MASK:>", "a budget must be a positive integer, got nothing"),
        ("/* <MASK:48 */", "a mask must end with '>': <MASK> or <MASK:N>"),
        ("/* <MASK 48> */", "expected <MASK> or <MASK:N>"),
        ("/* <MASK>> */", "only blanks may follow the mask in its comment"),
        ("// <MASK> and more", "only blanks may follow the mask in its comment"),
        ("/* <MASK> <MASK> */", "only blanks may follow the mask in its comment"),
    ],
)
def test_malformed_masks_are_reported_not_taken(comment: str, reason: str) -> None:
    text = f"__device__ void f() {{\n  {comment}\n}}\n"
    doc = parse_document(text)
    assert doc.masks == []
    (bad,) = doc.malformed_masks
    assert isinstance(bad, MalformedMask)
    assert bad.reason == reason
    assert bad.text == comment
    assert bad.range == Range(Position(1, 2), Position(1, 2 + len(comment)))
    assert encode_text(text)[bad.start_byte : bad.end_byte] == comment.encode()
    assert bad.to_json() == {"range": bad.range.to_json(), "text": comment, "reason": reason}


@pytest.mark.parametrize(
    "comment", ["/* <mask> */", "/* MASK */", "/* TODO <MASK> */", "/* <MASKED> */", "// <MASK_A>", "/* x */"]
)
def test_comments_that_are_not_mask_attempts_are_not_reported(comment: str) -> None:
    doc = parse_document(f"__device__ void f() {{\n  {comment}\n}}\n")
    assert (doc.masks, doc.malformed_masks) == ([], [])


def test_malformed_masks_do_not_take_an_index_and_crlf_is_excluded() -> None:
    text = "__global__ void k() {\r\n  // <MASK:0>\r\n  /* <MASK> */\r\n}\r\n"
    doc = parse_document(text)
    assert [m.index for m in doc.masks] == [0]
    (bad,) = doc.malformed_masks
    assert bad.text == "// <MASK:0>" and bad.range.end == Position(1, 13)


# ------------------------------------------------------------------------------------------ has_errors


VALID_MACRO_HEAVY = [
    "#define DEVICE_INLINE __device__ __forceinline__\nDEVICE_INLINE float f(float x) { return x; }\n",
    "DEVICE_INLINE float f(float x) { return x; }\n",  # the macro comes from a header
    "#define LB(n) __launch_bounds__(n)\n__global__ void LB(256) k(float* x) { x[0] = 1; }\n",
    "#define RESTRICT __restrict__\n__global__ void k(const float * RESTRICT x, float * RESTRICT y) {\n"
    "    const float * RESTRICT p = x;\n    y[0] = p[0];\n}\n",
    '#define API\nextern "C" {\n    NORETURN FORMAT(3, 4)\n    API void fail(const char * f, ...);\n'
    "    API struct ctx * make(int n);\n    API ctx_t make2(int n);\n}\n",
    "__global__ void k(float* x) {\n    CHECK(x)\n    LOCALS\n    const int n = ((const int *)(x))[0];\n}\n",
    '#define S "/* not a comment */"\n#define T(x) f("(" x\n__global__ void k() {}\n',
    "template <typename T> struct S { T v; };\ntemplate struct S<float>;\n",
    '#ifdef __cplusplus\nextern "C" {\n#endif\nvoid f(void);\n#ifdef __cplusplus\n}\n#endif\n',
    "__global__ void k(int* x) {\n#if defined(A)\n    if (x) {\n#else\n    if (!x) {\n#endif\n"
    "        x[0] = 1;\n    }\n}\n",
    "struct S {\n    MGPU_HOST_DEVICE value_type operator[](int i) const { return v[i]; }\n"
    "    int v[4];\n};\n",
    "using halfx8_t = __attribute__((ext_vector_type(8))) _Float16;\n",
]


@pytest.mark.parametrize("text", VALID_MACRO_HEAVY)
def test_errors_explained_by_unexpanded_macros_are_not_syntax_errors(text: str) -> None:
    assert not parse_document(text).has_errors


BROKEN = [
    "__global__ void k(float* x, int n) {\n  int i = threadIdx.x;\n  /* <MASK> */\n  if (i < n) {\n",
    "__global__ void k(float* x) {\n  x[0] = BLOCK + ;\n}\n",
    "__global__ void k(float* x) {\n  x[0] = MAX(x[1], ;\n}\n",
    "__global__ void k(float* x) {\n  for (int i = 0; i < N; i++ {\n  }\n}\n",
    "__global__ void k(float* x) {\n  x[0] = ;\n}\n",
    "DEVICE_INLINE float f(float x) {\n    return x +;\n}\n",
    "#define DEV __device__\nDEV float f(float x) {\n    float y = x\n    return y;\n}\n",
    "__global__ void k(float* x {\n  x[0] = 1;\n}\n",
    "__global__ void k(float* x) {\n  x[0] = 1;\n",
]


@pytest.mark.parametrize("text", BROKEN)
def test_real_syntax_errors_still_count(text: str) -> None:
    assert parse_document(text).has_errors


# ------------------------------------------------------------------------------------------ is_template


def test_is_template_marks_template_bodies() -> None:
    text = """template <typename T> __device__ T sq(T v) { return v * v; }
template <> __device__ float sq<float>(float v) { return v * v; }
__global__ void k(float* x) { x[0] = sq(x[0]); }
template <int N> struct Tile {
    __device__ int size() const { return N; }
    struct Inner { __device__ int one() const { return 1; } };
};
template <int N> __device__ int twice() { return 2 * N; }
struct Plain { __device__ int get() const { return 1; }
               template <class U> __device__ U as() const { return U(1); } };
template <typename T>
__global__ void typing(T* x) {
    x[0] =
"""
    doc = parse_document(text)
    data = encode_text(text)

    def at(needle: bytes) -> bool:
        info = function_at(doc, data.index(needle))
        assert info is not None, needle
        return info.is_template

    assert at(b"return v * v; }\ntemplate <>")
    assert not at(b"return v * v; }\n__global__")  # an explicit specialisation is an ordinary function
    assert not at(b"x[0] = sq(")
    assert at(b"return N;")
    assert at(b"return 1; } };")
    assert at(b"return 2 * N;")
    assert not at(b"return 1; }\n               template")
    assert at(b"return U(1);")
    typing = function_at(doc, len(data))
    assert typing is not None and typing.recovered and typing.name == "typing" and typing.is_template
