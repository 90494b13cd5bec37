"""The shape of a hole from its place in the file (dice.assistant.shape), carried by the infilling request
and applied to the fills the pipeline ranks (dice.assistant.fills.shaped_fill)."""

from __future__ import annotations

import pytest

from dice.assistant import AssistantService, AssistantSettings
from dice.assistant.fills import hole_of, shaped_fill
from dice.assistant.prompting import InfillRequest, build_infill_request
from dice.assistant.shape import hole_shape
from dice.cuda_source import parse_document

from .conftest import TWO_MASKS

CURSOR = "@"


def shape_in(body: str, *, wrap: bool = True) -> str:
    """The shape of the one hole in ``body`` (a mask comment, or ``@`` for a cursor), inside a kernel."""
    text = f"__global__ void k(float* y, const float* x, int n) {{\n{body}\n}}\n" if wrap else body
    if CURSOR in text:
        at = text.encode().index(CURSOR.encode())
        data = text.replace(CURSOR, "").encode()
        return hole_shape(data, at, at)
    (mask,) = parse_document(text).masks
    return hole_shape(parse_document(text).data, mask.start_byte, mask.end_byte)


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        # alone on its line among other statements: one statement
        ("    int i = threadIdx.x;\n    /* <MASK> */\n    y[i] = 0;", "statement"),
        ("    int i = threadIdx.x;\n    // <MASK:48>\n    y[i] = 0;", "statement"),
        ("    int i = 0;\n\t/* <MASK> */  \n    y[i] = 0;", "statement"),
        ("    int i = 0;\n    /*\n       <MASK> */\n    y[i] = 0;", "statement"),
        ("    int i = 0;\n    #pragma unroll\n    // <MASK>\n    y[i] = 0;", "statement"),
        ("    for (int i = 0; i < n; ++i)\n        // <MASK>\n    y[0] = 0;", "statement"),
        ("    if (n > 0) {\n        y[0] = 1;\n        // <MASK>\n    }", "statement"),
        # the whole body of braces: a block (comments between the braces and the mask do not count)
        ("    // <MASK>", "block"),
        ("    /*\n       <MASK>\n    */", "block"),
        ("    for (int i = 0; i < n; ++i) {\n        /* <MASK> */\n    }", "block"),
        (
            "    for (int i = 0; i < n; ++i) {  // each i\n        // the body\n        /* <MASK> */\n    }",
            "block",
        ),
        ("    if (n > 0) { /* <MASK> */ }", "block"),
        # where a statement starts on a line with code
        ("    y[0] = 1.0f; /* <MASK> */", "statement"),
        ("    if (n > 0) { y[0] = 1; /* <MASK> */ }", "statement"),
        ("    if (n > 0) /* <MASK> */", "statement"),
        ("    if (n > 0) y[0] = 1; else /* <MASK> */", "statement"),
        ("    /* <MASK> */ y[0] = 1;", "statement"),
        ("    y[0] = 1; /* note */ /* <MASK> */ // more", "statement"),
        # inside an expression or an argument list
        ("    y[0] = /* <MASK> */;", "expression"),
        ("    y[0] = fmaxf(x[0], /* <MASK> */);", "expression"),
        ("    y[0] = fmaxf(/* <MASK> */, x[0]);", "expression"),
        ("    if (/* <MASK> */) { y[0] = 1; }", "expression"),
        ("    y[/* <MASK> */] = 0;", "expression"),
        ("    y[0] = x[0] /* <MASK> */ + 1;", "expression"),
        ("    if (foo(n) /* <MASK> */ ) y[0] = 1;", "expression"),
        # after code, at the end of its line: the rest of the line
        ("    float v = /* <MASK> */", "line"),
        ("    float v = x[0] + /* <MASK> */ // why", "line"),
        # the implicit hole at a cursor
        ("    int i = threadIdx.x;\n    @\n    y[i] = 0;", "statement"),
        ("    int i = threadIdx.x;\n@", "statement"),
        ("    @", "block"),
        ("    int i = @", "line"),
        ("    int i = thread@Idx.x;", "expression"),
        ("    int i = threadIdx.x;@", "statement"),
        ("    y[i] = fmaxf(@, 0.0f);", "expression"),
    ],
)
def test_hole_shape(body: str, shape: str) -> None:
    assert shape_in(body) == shape


def test_outside_functions_and_at_the_file_edges() -> None:
    assert hole_shape(b"/* <MASK> */", 0, 12, in_function=False) == "block"
    assert hole_shape(b"/* <MASK> */", 0, 12) == "statement"  # nothing around it at all
    assert hole_shape(b"", 0, 0) == "statement"
    text = "#include <cuda.h>\n/* <MASK> */\n__global__ void k() {}\n"
    doc = parse_document(text)
    req = build_infill_request(doc, hole_of(doc.masks[0]), default_max_new_tokens=64, budget_chars=None)
    assert req.shape == "block"  # a hole between functions: no cut but the suffix


def test_the_request_carries_the_shape() -> None:
    doc = parse_document(TWO_MASKS)
    scale, square = (
        build_infill_request(doc, hole_of(m), default_max_new_tokens=64, budget_chars=None) for m in doc.masks
    )
    assert scale.shape == "statement" and scale.max_new_tokens == 64
    assert square.shape == "block" and square.max_new_tokens == 16  # `// <MASK:16>` keeps its budget
    off = build_infill_request(
        doc, hole_of(doc.masks[0]), default_max_new_tokens=64, budget_chars=None, shaped=False
    )
    assert off.shape is None and off.key() != scale.key()
    line = build_infill_request(
        doc, hole_of(doc.masks[0]), default_max_new_tokens=64, budget_chars=None, hole_cut="line"
    )
    assert line.line_aligned and line.shape == "statement"


def test_shaped_fill_cuts_then_maps_onto_the_mask() -> None:
    statement = InfillRequest("p", "s", None, 64, shape="statement")
    assert shaped_fill(statement, "x = 1;\n    y = 2;\n") == "x = 1;"
    # whole-line holes: the first line's indentation and the line break go, as before
    lines = InfillRequest("p", "s", None, 64, line_aligned=True, shape="statement")
    assert shaped_fill(lines, "        x = 1;\n        y = 2;\n") == "x = 1;"
    block = InfillRequest("p", "s", None, 64, shape="block")
    assert shaped_fill(block, "x = 1;\n    y = 2;") == "x = 1;\n    y = 2;"
    assert shaped_fill(InfillRequest("p", "s", None, 64), "a;\nb;") == "a;\nb;"
    expression = InfillRequest("p", "s", None, 64, shape="expression")
    assert shaped_fill(expression, "a * x[i]);\n") == "a * x[i]"


async def test_the_pipeline_asks_for_the_shape_and_cuts_what_comes_back(scripted_engine_factory) -> None:
    # an engine that knows nothing of shapes: the pipeline still cuts its fills
    engine = scripted_engine_factory(
        lambda p, s, n, t: (
            [("if (i < n) y[i] = a * x[i];\n    y[0] = 0;\n", 0.7)]
            if "square" in s
            else [("return v * v;\n    v = 0;\n", 0.6)]
        )
    )
    calls: list[dict] = []
    infill = engine.infill

    def recording(prefix, suffix, **kwargs):
        calls.append(kwargs)
        return infill(prefix, suffix, **kwargs)

    engine.infill = recording
    service = AssistantService(AssistantSettings(candidates=1, validation_level="none"), engine=engine)
    result = await service.complete_document(TWO_MASKS)
    scale, square = result.masks
    assert [c["shape"] for c in calls] == ["statement", "block"]
    assert scale.candidates[0].text == "if (i < n) y[i] = a * x[i];"  # one statement
    assert square.candidates[0].text == "return v * v;\n    v = 0;\n"  # the whole body: as generated
    service.close()
