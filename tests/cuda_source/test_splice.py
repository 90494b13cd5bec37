"""Splicing fills into masks; generated documents whose masks must be found exactly where they were put."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dice.cuda_source import Position, TextEdit, encode_text, parse_document, splice

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def apply_lsp_edits(text: str, edits: list[TextEdit]) -> str:
    """Apply edits the way an LSP client does (all ranges refer to the original text), written
    independently of PositionIndex: offsets counted in UTF-16 code units of each line."""
    lines: list[tuple[int, int]] = []  # (start, end-of-content) in code point offsets
    start = i = 0
    while i < len(text):
        if text[i] == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
            lines.append((start, i))
            i += 2
            start = i
        elif text[i] in "\r\n":
            lines.append((start, i))
            i += 1
            start = i
        else:
            i += 1
    lines.append((start, len(text)))

    def offset(position: Position) -> int:
        line_start, line_end = lines[position.line]
        units = 0
        j = line_start
        while j < line_end and units < position.character:
            units += 2 if ord(text[j]) > 0xFFFF else 1
            j += 1
        assert units == position.character, "position inside a character or past the line"
        return j

    spans = sorted((offset(e.range.start), offset(e.range.end), e.new_text) for e in edits)
    out, cursor = [], 0
    for begin, end, new in spans:
        assert begin >= cursor, "overlapping edits"
        out.append(text[cursor:begin])
        out.append(new)
        cursor = end
    out.append(text[cursor:])
    return "".join(out)


SOURCE = "__global__ void k(float* y) {\r\n\t/* <MASK> */ // 😀\r\n\ty[1] = 0; // <MASK:8>\r\n}\r\n"


def test_splice_replaces_only_the_masks() -> None:
    result = splice(SOURCE, {0: "y[0] = 1.0f; /* é */", 1: "y[2] = 2.0f;"})
    assert result.text == (
        "__global__ void k(float* y) {\r\n\ty[0] = 1.0f; /* é */ // 😀\r\n\ty[1] = 0; y[2] = 2.0f;\r\n}\r\n"
    )
    assert apply_lsp_edits(SOURCE, result.edits) == result.text
    assert [(e.range.start.line, e.range.start.character) for e in result.edits] == [(1, 1), (2, 11)]


def test_splice_some_masks_and_none() -> None:
    result = splice(SOURCE, {1: "int z;"})
    assert "/* <MASK> */" in result.text and "<MASK:8>" not in result.text
    assert len(result.edits) == 1
    assert splice(SOURCE, {}).text == SOURCE
    assert splice(SOURCE, {}).edits == []
    # Filling a mask with its own text is no change at all.
    assert splice(SOURCE, {0: "/* <MASK> */"}).edits == []


def test_edits_are_minimal() -> None:
    result = splice(SOURCE, {0: "/* <MASK> */ x = 1;"})
    (edit,) = result.edits
    assert edit.new_text == " x = 1;"
    assert edit.range.start == edit.range.end == Position(line=1, character=13)


def test_splice_rejects_bad_fills() -> None:
    with pytest.raises(ValueError, match="no mask with index 5"):
        splice(SOURCE, {5: "x"})
    with pytest.raises(ValueError, match="not str"):
        splice(SOURCE, {0: 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"mask indices: none"):
        splice("int x;", {0: "y"})


def test_splice_accepts_a_parsed_document_and_ignores_a_stale_one() -> None:
    doc = parse_document(SOURCE)
    assert splice(SOURCE, {0: "a;"}, doc=doc).text == splice(SOURCE, {0: "a;"}).text
    stale = parse_document("/* <MASK> */")
    assert splice(SOURCE, {0: "a;"}, doc=stale).text == splice(SOURCE, {0: "a;"}).text


@pytest.mark.parametrize("name", ["vector_add.cu", "softmax_rows.cu", "tiled_matmul.cu"])
def test_solutions_are_the_examples_with_masks_filled(name: str) -> None:
    example = (EXAMPLES / name).read_text()
    solution = (EXAMPLES / "solutions" / name).read_text()
    doc = parse_document(example)
    data, solved = encode_text(example), encode_text(solution)
    # Between masks the two files must agree byte for byte; what remains are the fills.
    fills, cursor, position = {}, 0, 0
    bounds = [(m.start_byte, m.end_byte) for m in doc.masks] + [(len(data), len(data))]
    for index, (start, end) in enumerate(bounds):
        between = data[cursor:start]
        if index == len(doc.masks):
            assert solved[position:] == between
            break
        assert solved[position : position + len(between)] == between
        position += len(between)
        following = data[end : bounds[index + 1][0]]
        next_position = solved.index(following, position) if following else len(solved)
        fills[index] = solved[position:next_position].decode()
        position, cursor = next_position, end
    assert splice(example, fills).text == solution
    assert parse_document(solution).masks == []


# ----------------------------------------------------------------------- generated documents (hypothesis)

# Pieces of a CUDA file. Each tuple: (text, mask budget or False when the piece is not a mask).
CODE = st.sampled_from(
    [
        "int i = threadIdx.x;",
        "x[i] = 2.0f * x[i];",
        "{",
        "}",
        "(",
        ")",
        ";",
        " ",
        "\t",
        "\n",
        "\r\n",
        "__global__ void k(float* x) {",
        "__device__ float f(float a) {",
        "if (i < n) {",
        "return;",
        "float café = 1.0f;",
        "// ordinary comment 😀\n",
        "/* block\r\n comment é */",
        'R"(raw /* <MASK> */)"',
        '"/* <MASK> */"',
        '"// <MASK:4>"',
        "'<'",
        "/* TODO <MASK> later */",
        "// see <MASK:3> below\n",
        "#define N 4\n",
        "#include <cuda_fp16.h>\n",
        "\u00a0",
        "𝑥",
        "🚀",
        "\x00",
    ]
)
MASK = st.builds(
    lambda style, pad1, pad2, budget: (
        (f"/*{pad1}<MASK{'' if budget is None else f':{budget}'}>{pad2}*/", budget, "block")
        if style == "block"
        else (f"//{pad1}<MASK{'' if budget is None else f':{budget}'}>{pad2}", budget, "line")
    ),
    st.sampled_from(["block", "line"]),
    st.sampled_from(["", " ", "  ", "\t"]),
    st.sampled_from(["", " ", "\t "]),
    st.one_of(st.none(), st.integers(1, 4096)),
)
PIECES = st.lists(st.one_of(CODE.map(lambda c: (c, None, None)), MASK), max_size=40)


def build(pieces: list[tuple[str, int | None, str | None]]) -> tuple[str, list[tuple[int, int, int | None]]]:
    """The document, and the (start_byte, end_byte, budget) of each mask piece put into it."""
    text, masks = "", []
    for piece, budget, style in pieces:
        if style is None:
            text += piece
            continue
        # A mask must start outside any comment or literal: put it on a fresh line after a statement end.
        text += "\n;"
        start = len(encode_text(text))
        text += piece
        masks.append((start, len(encode_text(text)), budget))
        text += "\n"
    return text, masks


@given(PIECES)
@settings(max_examples=150, deadline=None)
# error recovery once left the string's opening quote in an ERROR node before the "comment" inside it
@example([("int i = threadIdx.x;", None, None), ("}'<'", None, None), ('"/* <MASK> */"', None, None)])
def test_generated_masks_are_found_exactly(pieces: list[tuple[str, int | None, str | None]]) -> None:
    text, expected = build(pieces)
    doc = parse_document(text)
    assert [(m.start_byte, m.end_byte, m.budget) for m in doc.masks] == expected
    data = encode_text(text)
    for mask in doc.masks:
        prefix = data[: mask.start_byte].decode("utf-8", "surrogatepass")
        line = prefix.count("\n") + prefix.count("\r") - prefix.count("\r\n")
        last_break = max(prefix.rfind("\n"), prefix.rfind("\r"))
        column = len(prefix[last_break + 1 :].encode("utf-16-le", "surrogatepass")) // 2
        assert mask.range.start == Position(line, column)


@given(PIECES, st.data())
@settings(max_examples=150, deadline=None)
def test_splice_round_trips(pieces: list[tuple[str, int | None, str | None]], data: st.DataObject) -> None:
    text, _ = build(pieces)
    doc = parse_document(text)
    chosen = data.draw(st.sets(st.integers(0, len(doc.masks) - 1))) if doc.masks else set()
    alphabet = st.sampled_from([*"ab; {}\n\r\t\u00e9😀", "\r\n", "x[i]"])
    fill_text = st.lists(alphabet, max_size=12).map("".join)
    fills = {i: data.draw(fill_text) for i in chosen}
    result = splice(text, fills, doc=doc)
    # The edits produce the same text as the splice, applied the LSP way.
    assert apply_lsp_edits(text, result.edits) == result.text
    # Untouched bytes are byte-identical: rebuild the result from the original's slices and the fills.
    original = encode_text(text)
    rebuilt, cursor = b"", 0
    for mask in doc.masks:
        if mask.index in fills:
            rebuilt += original[cursor : mask.start_byte] + encode_text(fills[mask.index])
            cursor = mask.end_byte
    rebuilt += original[cursor:]
    assert encode_text(result.text) == rebuilt
    # Putting the original mask comments back restores the text exactly, when the fills add no masks.
    if all("<MASK" not in f for f in fills.values()):
        spliced_doc = parse_document(result.text)
        if len(spliced_doc.masks) == len(doc.masks) - len(fills):
            marker = {i: f"/* <MASK:{9000 + i}> */" for i in fills}
            marked = splice(text, marker, doc=doc).text
            marked_doc = parse_document(marked)
            restore = {
                m.index: original[
                    doc.masks[m.budget - 9000].start_byte : doc.masks[m.budget - 9000].end_byte
                ].decode("utf-8", "surrogatepass")
                for m in marked_doc.masks
                if m.budget is not None and m.budget >= 9000
            }
            assert splice(marked, restore).text == text
