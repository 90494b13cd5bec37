"""Whole-line holes (``infill_holes: "line"`` in a model's dice.json): the prompt pieces, the mapping of the
generated lines back onto the mask comment, byte-exact splices; and the embedded model on an example."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dice.assistant import AssistantService, AssistantSettings
from dice.assistant.prompting import (
    Hole,
    InfillRequest,
    build_infill_request,
    line_aligned_span,
    line_middle_to_mask_fill,
)
from dice.cli import main
from dice.cuda_source import parse_document
from engine.model_settings import read_hole_cut

from .conftest import ScriptedEngine

REPO = Path(__file__).resolve().parents[2]
TILED_MATMUL = REPO / "examples" / "tiled_matmul.cu"

# masks alone on their line (spaces, a tab, a block comment over two lines) and one after code
LINES = (
    "__global__ void k(float* y, int n) {  // é 𝄞\n"
    "    int i = threadIdx.x;\n"
    "    /* <MASK> */  \n"
    "\tif (i < n) {\n"
    "\t\t// <MASK:16>\n"
    "\t}\n"
    "    /*\n"
    "       <MASK> */\n"
    "    y[0] = 1.0f; /* <MASK> */\n"
    "}\n"
)


def _holes(text: str) -> tuple[Any, list[Hole]]:
    doc = parse_document(text)
    return doc, [
        Hole(m.index, m.start_byte, m.end_byte, m.budget, m.function_start_byte, m.function_end_byte)
        for m in doc.masks
    ]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_aligned_prompt_pieces(newline: str) -> None:
    text = LINES.replace("\n", newline)
    doc, holes = _holes(text)
    assert len(holes) == 4
    reqs = [
        build_infill_request(doc, h, default_max_new_tokens=64, budget_chars=None, hole_cut="line")
        for h in holes
    ]
    nl = newline
    # alone on its line (trailing blanks after the comment go with the hole)
    assert reqs[0].line_aligned
    assert reqs[0].prefix.endswith(f"int i = threadIdx.x;{nl}")
    assert reqs[0].suffix.startswith(f"\tif (i < n) {{{nl}")
    # a tab-indented mask; the prompt keeps the file's CRLF
    assert reqs[1].line_aligned and reqs[1].max_new_tokens == 16
    assert reqs[1].prefix.endswith(f"\tif (i < n) {{{nl}") and reqs[1].suffix.startswith(f"\t}}{nl}")
    # a block comment over two lines: both lines leave the prompt
    assert reqs[2].line_aligned
    assert reqs[2].prefix.endswith(f"\t}}{nl}") and reqs[2].suffix.startswith("    y[0] = 1.0f;")
    # after code on its line: today's byte cut
    assert not reqs[3].line_aligned
    assert reqs[3].prefix.endswith("    y[0] = 1.0f; ") and reqs[3].suffix == f"{nl}}}{nl}"
    # the prefix is the file up to the hole: non-ASCII before it is intact
    assert reqs[0].prefix.startswith("__global__ void k(float* y, int n) {  // é 𝄞")


def test_byte_cut_is_the_default() -> None:
    doc, holes = _holes(LINES)
    req = build_infill_request(doc, holes[0], default_max_new_tokens=64, budget_chars=None)
    assert not req.line_aligned
    assert req.prefix.endswith("threadIdx.x;\n    ") and req.suffix.startswith("  \n\tif (i < n)")
    # the hole starts its line after the indentation: blanks a model writes before the code are dropped
    # (the file keeps its own), the rest of the middle is kept as it is
    assert req.mask_fill("  x;\n    y;") == "x;\n    y;"
    after_code = build_infill_request(doc, holes[3], default_max_new_tokens=64, budget_chars=None)
    assert after_code.mask_fill(" z = 2;") == " z = 2;"  # after code on its line: nothing is mapped
    # a cursor in column 0: the indentation is the fill's own
    at_line_start = InfillRequest("{\n", "\n}", None, 8)
    assert at_line_start.mask_fill("    x;") == "    x;"


def test_line_aligned_span_edges() -> None:
    data = b"a;\n  /* <MASK> */"  # at the end of the file, no line break after it
    start = data.index(b"/*")
    assert line_aligned_span(data, start, len(data)) == (3, len(data))
    assert line_aligned_span(data, start, start) is None  # a cursor is never widened
    data = b"/* <MASK> */ /* <MASK> */\n"  # two masks on one line: neither is alone
    assert line_aligned_span(data, 0, 12) is None and line_aligned_span(data, 13, 25) is None
    data = b"\r\n\t/* <MASK> */\t\r\nx\n"
    assert line_aligned_span(data, 3, 15) == (2, 18)


@pytest.mark.parametrize(
    ("middle", "fill"),
    [
        ("            acc += a;\n", "acc += a;"),
        ("acc += a;", "acc += a;"),  # no indentation, no line break: nothing to strip
        ("\t\tacc += a;  \r\n", "acc += a;"),
        ("    x = 1;\n    if (x) {\n        y();\n    }\n", "x = 1;\n    if (x) {\n        y();\n    }"),
        ("    x = 1;\n\n", "x = 1;\n"),  # only one line break belongs to the file
        ("\n", ""),
        ("", ""),
        ('  s = "é 𝄞";\n', 's = "é 𝄞";'),
    ],
)
def test_line_middle_maps_onto_the_comment(middle: str, fill: str) -> None:
    assert line_middle_to_mask_fill(middle) == fill


def test_hole_cut_comes_from_the_model_folder(tmp_path: Path) -> None:
    assert read_hole_cut(None) == "byte"
    assert read_hole_cut(tmp_path) == "byte"  # no dice.json
    (tmp_path / "dice.json").write_text('{"other": 1}')
    assert read_hole_cut(tmp_path) == "byte"
    (tmp_path / "dice.json").write_text('{"infill_holes": "line"}')
    assert read_hole_cut(tmp_path) == "line"
    (tmp_path / "dice.json").write_text('{"infill_holes": "lines"}')
    with pytest.raises(ValueError, match="infill_holes must be one of byte, line"):
        read_hole_cut(tmp_path)
    (tmp_path / "dice.json").write_text("{not json")
    with pytest.raises(ValueError, match="dice.json: not a readable JSON file"):
        read_hole_cut(tmp_path)
    (tmp_path / "dice.json").write_text("[]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_hole_cut(tmp_path)


def _line_model(tmp_path: Path, fills: Any) -> ScriptedEngine:
    (tmp_path / "dice.json").write_text(json.dumps({"infill_holes": "line"}))
    engine = ScriptedEngine(fills)
    engine.path = tmp_path  # type: ignore[attr-defined]
    return engine


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
async def test_line_fills_splice_byte_exact(tmp_path: Path, newline: str) -> None:
    text = LINES.replace("\n", newline)
    # what a line-trained model answers: whole lines, indented, ending with a line break
    answers = {
        "int i = threadIdx.x;": "    i += 1;  \n",
        "\tif (i < n) {": "\t\ty[i] = 2.0f;\n\t\ty[i] += 1.0f;\n",
        "\t}": "    y[1] = 0.5f; // é 𝄞\n",
        "y[0] = 1.0f; ": "y[2] = 3.0f;",
    }

    def fills(prefix: str, suffix: str, n: int, t: float) -> list[tuple[str, float]]:
        # the prompt's last line before the hole says which mask this is
        last = prefix.removesuffix("\n").removesuffix("\r").rsplit("\n", 1)[-1]
        key = next(k for k in answers if last.endswith(k))
        return [(answers[key], 0.9)] * n

    engine = _line_model(tmp_path, fills)
    settings = AssistantSettings(candidates=1, validation_level="none", max_latency_ms=0)
    with AssistantService(settings, engine=engine) as service:
        result = await service.complete_document(text)
    got = [m.candidates[0].text for m in result.masks]
    assert got == ["i += 1;", "y[i] = 2.0f;\n\t\ty[i] += 1.0f;", "y[1] = 0.5f; // é 𝄞", "y[2] = 3.0f;"]
    # the prompts were whole lines for the three masks alone on their lines, a byte cut for the fourth
    assert [r["prefix"].endswith(newline) for r in engine.requests] == [True, True, True, False]
    # every byte outside the comments is untouched
    doc = parse_document(text)
    data, pieces, cursor = doc.data, [], 0
    for m, fill in zip(doc.masks, got, strict=True):
        pieces += [data[cursor : m.start_byte], fill.encode()]
        cursor = m.end_byte
    assert result.best_text.encode() == b"".join(pieces) + data[cursor:]
    assert f"    i += 1;  {newline}\tif" in result.best_text  # the file's own indentation and trailing blanks


def test_embedded_model_on_tiled_matmul_is_deterministic(shared_pool, capsys) -> None:
    """The greedy fill of examples/tiled_matmul.cu with the embedded dice-tiny (byte cuts, its dice.json).
    Whether it compiles depends on the weights, so what is asserted is what is deterministic: the same
    statement on every run, spliced after the file's indentation (no blanks of its own), with a compile
    verdict for the mask's line."""
    args = [
        "complete",
        str(TILED_MATMUL),
        "--candidates",
        "1",
        "--validation",
        "compile",
        "--json",
        "--quiet",
    ]
    runs = []
    for _ in range(2):
        assert main(args) in (0, 1)
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["masks"] == runs[1]["masks"]
    (mask,) = runs[0]["masks"]
    (cand,) = mask["candidates"]
    text = cand["text"]
    assert text and text == text.strip() and "\n" not in text and text.endswith(";")
    verdict = cand["verdict"]
    assert verdict["status"] in ("compiled", "compile_error")
    if not verdict["compiled"]:
        assert {d["line"] for d in verdict["diagnostics"]} == {mask["range"]["start"]["line"]}


async def test_embedded_model_with_line_holes(tmp_path: Path, validator_pool) -> None:
    """The real dice-tiny weights told to use whole-line holes: the fill is mapped back onto the comment
    (no indentation of its own, no line break) and the rest of the file is unchanged."""
    from engine.locate import EMBEDDED_MODEL

    model = tmp_path / "dice-tiny-lines"
    shutil.copytree(EMBEDDED_MODEL, model)
    (model / "dice.json").write_text('{"infill_holes": "line"}')
    text = TILED_MATMUL.read_text()
    settings = AssistantSettings(
        model_path=str(model), device="cpu", candidates=1, validation_level="compile", max_latency_ms=0
    )
    with AssistantService(settings, validator=validator_pool) as service:
        result = await service.complete_document(text)
    (m,) = result.masks
    fill = m.candidates[0].text
    assert fill and fill == fill.strip()
    start, end = m.mask.start_byte, m.mask.end_byte
    data = text.encode()
    assert result.best_text.encode() == data[:start] + fill.encode() + data[end:]
