"""dice.cuda_source: positions, masks, functions, dice-spec, robustness on half-typed and junk input."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dice.cuda_source import (
    Position,
    PositionIndex,
    Range,
    encode_text,
    extract_device_code,
    function_at,
    parse_document,
    utf16_length,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def lsp_position_by_hand(text: str, char_offset: int) -> Position:
    """Reference conversion, independent of PositionIndex: split on LSP line breaks, count UTF-16 units."""
    before = text[:char_offset]
    line = 0
    line_start = 0
    i = 0
    while i < len(before):
        ch = before[i]
        if ch == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
            if i + 1 >= len(before):
                break  # the offset sits between CR and LF: still on this line
            i += 2
            line += 1
            line_start = i
            continue
        if ch in "\r\n":
            line += 1
            line_start = i + 1
        i += 1
    return Position(line, len(text[line_start:char_offset].encode("utf-16-le")) // 2)


# --------------------------------------------------------------------------------------------- positions


def test_positions_count_utf16_units_for_astral_characters() -> None:
    text = "a😀b\n\tcafé 🚀x\r\nz"
    index = PositionIndex(text)
    data = encode_text(text)
    assert index.byte_to_position(data.index(b"b")) == Position(0, 3)  # 😀 is two UTF-16 units
    assert index.byte_to_position(data.index(b"x")) == Position(1, 8)  # \t c a f é space 🚀(2)
    assert index.byte_to_position(data.index(b"z")) == Position(2, 0)
    assert index.position_to_byte(Position(0, 3)) == data.index(b"b")
    assert index.position_to_byte(Position(1, 8)) == data.index(b"x")
    # Inside the surrogate pair of 😀: snaps back to the character's start.
    assert index.position_to_byte(Position(0, 2)) == 1
    # Past the end of a line: the end of that line (before CRLF); past the last line: end of text.
    assert index.position_to_byte(Position(1, 99)) == data.index(b"\r\n")
    assert index.position_to_byte(Position(9, 0)) == len(data)


def test_positions_line_breaks_follow_lsp() -> None:
    text = "a\rb\r\nc\nd"
    index = PositionIndex(text)
    assert index.line_count == 4
    assert [index.line_text(i) for i in range(4)] == ["a", "b", "c", "d"]
    # A byte between CR and LF belongs to the end of the first line.
    assert index.byte_to_position(4) == Position(1, 1)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_positions_round_trip_every_character_boundary(text: str) -> None:
    index = PositionIndex(text)
    offset = 0
    for i, ch in enumerate(text + "\0"):
        position = index.byte_to_position(offset)
        if not (i > 0 and text[i - 1] == "\r" and i < len(text) and ch == "\n"):
            assert position == lsp_position_by_hand(text, i)
            assert index.position_to_byte(position) == offset
        offset += len(ch.encode("utf-8"))
        if i == len(text):
            break


# ----------------------------------------------------------------------------------------------- masks

KERNEL = """#include <cuda_fp16.h>
__global__ void scale(float* x, int n) {
    const char* s = "/* <MASK> */";  // not a mask: a string
    const char* r = R"raw(// <MASK:9>)raw";
    char c = '<';
    /* fill <MASK> here */ // TODO <MASK>
    /* <MASK> */
    //\t<MASK:128>\t
    /*<MASK:7>*/ /*
       <MASK>
    */
}
"""


def test_finds_exactly_the_masks_with_exact_ranges_and_budgets() -> None:
    doc = parse_document(KERNEL)
    assert [
        (m.range.start.line, m.range.start.character, m.range.end.line, m.range.end.character)
        for m in doc.masks
    ] == [(6, 4, 6, 16), (7, 4, 7, 18), (8, 4, 8, 16), (8, 17, 10, 6)]
    assert [m.budget for m in doc.masks] == [None, 128, 7, None]
    assert [m.index for m in doc.masks] == [0, 1, 2, 3]
    data = encode_text(KERNEL)
    assert [data[m.start_byte : m.end_byte] for m in doc.masks] == [
        b"/* <MASK> */",
        b"//\t<MASK:128>\t",
        b"/*<MASK:7>*/",
        b"/*\n       <MASK>\n    */",
    ]
    assert all(m.function == "scale" and m.kind == "global" for m in doc.masks)
    assert doc.masks[0].signature == "__global__ void scale(float* x, int n)"
    assert doc.masks[0].to_json() == {
        "range": {"start": {"line": 6, "character": 4}, "end": {"line": 6, "character": 16}},
        "budget": None,
        "function": "scale",
        "kind": "global",
    }


@pytest.mark.parametrize(
    "comment",
    [
        "/* <MASK: 0> */",
        "/* <MASK:0> */",
        "/* <MASK:x> */",
        "/* <mask> */",
        "/* <MASK>> */",
        "/* MASK */",
        "// <MASK> and more",
        "/* <MASK> <MASK> */",
    ],
)
def test_near_misses_are_not_masks(comment: str) -> None:
    doc = parse_document(f"__device__ void f() {{\n  {comment}\n}}\n")
    assert doc.masks == []


def test_astral_characters_before_a_mask_shift_it_by_two_units_each() -> None:
    line = "    float a = 1; /* 😀😀 é */ /* <MASK> */ // 🚀"
    doc = parse_document("__global__ void k() {\n" + line + "\n}\n")
    (mask,) = doc.masks
    expected = len(line[: line.index("/* <MASK>")].encode("utf-16-le")) // 2
    assert expected == 30  # 28 characters, two of them astral
    assert mask.range == Range(Position(1, 30), Position(1, 42))
    assert encode_text(doc.text)[mask.start_byte : mask.end_byte] == b"/* <MASK> */"


def test_crlf_line_mask_stops_before_the_carriage_return() -> None:
    text = "__global__ void k(float* y) {\r\n\t// <MASK:32>\r\n\ty[0] = 1.0f;\r\n}\r\n"
    doc = parse_document(text)
    (mask,) = doc.masks
    assert encode_text(text)[mask.start_byte : mask.end_byte] == b"// <MASK:32>"
    assert mask.range == Range(Position(1, 1), Position(1, 13))
    assert (mask.function, mask.kind, mask.budget) == ("k", "global", 32)


def test_function_kinds_and_signatures() -> None:
    text = """#define HD __host__ __device__
template <typename T>
__device__ __forceinline__ T square(T v) { /* <MASK> */ }
HD float both(float a) { /* <MASK> */ }
extern "C" __global__ void __launch_bounds__(256) kern(const float* __restrict__ x) { /* <MASK> */ }
static float host_only(int n) { /* <MASK> */ return 0.f; }
struct Acc { __device__ float get() const { /* <MASK> */ return v; } float v; };
namespace ops { __global__ void inner() { /* <MASK> */ } }
float* make(int n) { /* <MASK> */ return nullptr; }
/* <MASK> */
"""
    doc = parse_document(text)
    got = [(m.function, m.kind) for m in doc.masks]
    assert got == [
        ("square", "device"),
        ("both", "device"),
        ("kern", "global"),
        ("host_only", "host"),
        ("get", "device"),
        ("inner", "global"),
        ("make", "host"),
        (None, None),
    ]
    sigs = [m.signature for m in doc.masks]
    assert sigs[0] == "template <typename T> __device__ __forceinline__ T square(T v)"
    assert sigs[2] == "__global__ void __launch_bounds__(256) kern(const float* __restrict__ x)"
    square = doc.functions[0]
    assert square.start_byte == 0 + len("#define HD __host__ __device__\n")  # the template header included
    assert text.encode()[square.body_start_byte : square.body_end_byte] == b"{ /* <MASK> */ }"


def test_function_at_returns_the_innermost_function() -> None:
    text = "struct S {\n  __device__ int f() { return 1; }\n};\n__global__ void k() { int x; }\n"
    doc = parse_document(text)
    data = text.encode()
    assert function_at(doc, data.index(b"return")).name == "f"
    assert function_at(doc, data.index(b"int x")).name == "k"
    assert function_at(doc, data.index(b"struct")) is None
    assert function_at(doc, len(data)) is None


# ------------------------------------------------------------------------------------ while the user types


def test_unclosed_kernel_still_gives_its_function() -> None:
    text = "__global__ void k(float* x, int n) {\n  int i = threadIdx.x;\n  /* <MASK> */\n  if (i < n) {\n"
    doc = parse_document(text)
    assert doc.has_errors
    (mask,) = doc.masks
    assert (mask.function, mask.kind) == ("k", "global")
    assert mask.signature == "__global__ void k(float* x, int n)"
    assert mask.range == Range(Position(2, 2), Position(2, 14))
    recovered = function_at(doc, mask.start_byte)
    assert recovered is not None and recovered.recovered


@pytest.mark.parametrize("tail", ["", "\n  \n\n", "\n  if (i) {\n    x[i] = 0;\n"])
def test_cursor_at_the_end_of_a_kernel_being_typed_is_inside_it(tail: str) -> None:
    head = "#define N 4\n__device__ float g() { return 1.0f; }\n"
    text = head + "__global__ void k(float* x) {\n  int i = 0;" + tail
    doc = parse_document(text)
    end = len(encode_text(text))
    func = function_at(doc, end)
    assert func is not None and func.name == "k" and func.recovered and func.kind == "global"
    assert func.body_start_byte < end <= func.body_end_byte
    assert function_at(doc, text.index("return")).name == "g"
    closed = parse_document(text + "\n}\n" * 3)
    assert function_at(closed, len(encode_text(closed.text))) is None


@pytest.mark.parametrize(
    "text",
    [
        "__global__ void k(float* x) {\n  x[0] = ;\n  /* <MASK> */\n}\n}\n}}\n",
        "}}}{{ __device__ void f( {\n/* <MASK> */ ))) ;;\n",
        "__global__ void k(float* x {\n  /* <MASK> */\n",
        "#if 1\n__global__ void k() {\n#else\n/* <MASK> */\n#endif\n",
        "template <typename T, int> __global__ void k(T* x) { x[0] = static_cast<T>(; /* <MASK> */ }",
    ],
)
def test_masks_survive_syntax_errors(text: str) -> None:
    doc = parse_document(text)
    assert len(doc.masks) == 1
    mask = doc.masks[0]
    assert encode_text(text)[mask.start_byte : mask.end_byte] == b"/* <MASK> */"
    assert mask.range.start == lsp_position_by_hand(text, text.index("/* <MASK> */"))


def test_empty_and_whitespace_files() -> None:
    for text in ("", " ", "\n\n", "\r\n"):
        doc = parse_document(text)
        assert (doc.masks, doc.spec, doc.functions) == ([], None, [])


def test_binary_junk_never_raises() -> None:
    rng = random.Random(1234)
    for _ in range(20):
        junk = rng.randbytes(rng.randrange(1, 3000))
        doc = parse_document(junk + b"\n/* <MASK> */\n" + junk)
        assert len(doc.masks) >= 1 or b"/*" in junk or b"//" in junk or b'"' in junk or b"'" in junk
        for mask in doc.masks:
            assert encode_text(doc.text)[mask.start_byte : mask.end_byte].startswith((b"/*", b"//"))


@given(st.binary(max_size=400))
@settings(max_examples=100, deadline=None)
def test_arbitrary_bytes_parse(data: bytes) -> None:
    doc = parse_document(data)
    index = doc.index
    for mask in doc.masks:
        assert index.position_to_byte(mask.range.start) == mask.start_byte
    device = extract_device_code(data)
    assert len(device.line_map) == device.source.count("\n")  # lines end in "\n", and only there
    assert all(0 <= line < index.line_count for line in device.line_map)


def test_lone_surrogates_and_nul_do_not_raise() -> None:
    text = "__global__ void k() {\n  // \ud800 odd\n  /* <MASK> */ \0\n}\n"
    doc = parse_document(text)
    (mask,) = doc.masks
    assert mask.range.start == Position(2, 2)
    assert mask.function == "k"


def test_non_ascii_identifiers_and_comments() -> None:
    text = (
        "// Ядро: нормализация строк — 🚀\n__global__ void norm_ü(float* данные, int n) {\n"
        "\tfloat café = данные[0]; /* коммент 😀 */\t/* <MASK:16> */\n}\n"
    )
    doc = parse_document(text)
    (mask,) = doc.masks
    line = text.splitlines()[2]
    assert mask.range.start == Position(2, utf16_length(line[: line.index("/* <MASK")])) == Position(2, 42)
    assert mask.budget == 16
    assert mask.function == "norm_ü" and mask.kind == "global"


def test_five_megabyte_file() -> None:
    body = "__device__ float f{i}(float x) {{ return x * {i}.0f; /* ünïcödé 😀 */ }}\n"
    chunks, size, i = [], 0, 0
    while size < 5_000_000:
        chunk = body.format(i=i)
        chunks.append(chunk)
        size += len(chunk.encode())
        i += 1
    middle = len(chunks) // 2  # one line per chunk before it
    chunks.insert(middle, "__global__ void middle(float* y) {\n    /* <MASK:64> */\n}\n")
    chunks.append("__global__ void last(float* y) {\n    // <MASK>\n}\n")
    text = "".join(chunks)
    doc = parse_document(text)
    assert [m.function for m in doc.masks] == ["middle", "last"]
    assert doc.masks[0].range.start == Position(middle + 1, 4)
    assert doc.masks[1].range.start == Position(text.count("\n") - 2, 4)
    assert len(doc.functions) == len(chunks)


# ------------------------------------------------------------------------------------------- dice-spec


def test_dice_spec_is_read_not_run() -> None:
    text = (
        "// header\n/* dice-spec\n    import torch\n\n    def inputs():\n        return [torch.ones(3)]\n"
        "    raise SystemExit('never executed')\n*/\n__global__ void k() {}\n"
    )
    doc = parse_document(text)
    assert doc.spec is not None
    assert doc.spec.source == (
        "import torch\n\ndef inputs():\n    return [torch.ones(3)]\nraise SystemExit('never executed')\n"
    )
    assert doc.spec.line_offset == 2
    assert text.splitlines()[doc.spec.line_offset].strip() == "import torch"
    assert doc.spec.range.start == Position(1, 0)


@pytest.mark.parametrize(
    "text",
    [
        "// dice-spec\n// x = 1\n",
        'const char* s = "/* dice-spec\\nx = 1 */";\n',
        "/* not a dice-spec */\n",
    ],
)
def test_things_that_are_not_a_spec(text: str) -> None:
    assert parse_document(text).spec is None


def test_crlf_spec_source_has_unix_newlines() -> None:
    doc = parse_document("/* dice-spec\r\n  a = 1\r\n  b = 2\r\n*/\r\n")
    assert doc.spec is not None and doc.spec.source == "a = 1\nb = 2\n"


# --------------------------------------------------------------------------------------------- examples


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vector_add.cu", [("vector_add", "global", None)]),
        ("softmax_rows.cu", [("softmax_rows", "global", 96), ("softmax_rows", "global", 64)]),
        ("tiled_matmul.cu", [("tiled_matmul", "global", 128)]),
    ],
)
def test_examples_masks(name: str, expected: list[tuple[str, str, int | None]]) -> None:
    doc = parse_document((EXAMPLES / name).read_text())
    assert [(m.function, m.kind, m.budget) for m in doc.masks] == expected
    assert not doc.has_errors


@pytest.mark.parametrize("name", ["vector_add.cu", "softmax_rows.cu"])
def test_example_specs_define_the_contract(name: str) -> None:
    spec = parse_document((EXAMPLES / name).read_text()).spec
    assert spec is not None
    tree = ast.parse(spec.source)  # valid Python; never executed here
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"inputs", "reference", "launch"} <= set(functions)
    assert functions["launch"].args.args[0].arg == "module"
    assert len(functions["reference"].args.args) == len(functions["launch"].args.args) - 1


def test_tiled_matmul_has_no_spec() -> None:
    assert parse_document((EXAMPLES / "tiled_matmul.cu").read_text()).spec is None


@pytest.mark.parametrize(
    "text",
    [
        "\U0001d465'<'R\"(raw /* <MASK> */)\"",  # hypothesis found it: tree-sitter's error recovery
        "x'<'R\"(raw /* <MASK> */)\"",
        'x\'<\'R"d(raw )" /* <MASK> */)d"',
        "x'<' \"a /* <MASK> */\"",
    ],
)
def test_a_mask_inside_a_literal_that_error_recovery_lexed_as_code_is_not_a_mask(text: str) -> None:
    assert parse_document(text).masks == []


def test_masks_after_literals_in_an_error_region_are_still_found() -> None:
    text = "x'<'R\"(raw)\" \"s\\\"\" '\\'' /* <MASK> */"
    assert [m.start_byte for m in parse_document(text).masks] == [text.encode().index(b"/*")]
