"""engine.shape: where a fill of a statement / expression / rest-of-line hole ends, and Engine.infill
stopping the decoder there (composed with the suffix check and a caller's ``until``)."""

from __future__ import annotations

from typing import Any

import pytest

from engine import load_engine
from engine.shape import SHAPES, check_shape, cut_to_shape, shape_end


def cut(text: str, shape: str = "statement") -> str | None:
    """The fill cut at its shape's end (None: no end found)."""
    text_out, ended = cut_to_shape(text, shape)
    return text_out if ended else None


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        ("x = 1;\n    y = 2;\n", "x = 1;"),
        # the comments on its last line stay with it
        ("acc += a[i] * b[i];  // multiply\n    acc = 0;", "acc += a[i] * b[i];  // multiply"),
        ("x = 1; /* a */ /* b */ // c\r\n y;", "x = 1; /* a */ /* b */ // c"),
        ("x = 1; /* a\n b */ y;", "x = 1;"),
        ("x = 1; y = 2;", "x = 1;"),
        # a ';' in a string, a character literal, a comment does not end the statement
        ('printf("a;b\\";c");\n    z = 1;', 'printf("a;b\\";c");'),
        ("c = ';'; d = 0;", "c = ';';"),
        ("x = /* ; */ 1; // ;\n y;", "x = /* ; */ 1; // ;"),
        ("x = 1 // ;\n    + 2;\n y;", "x = 1 // ;\n    + 2;"),
        ('s = R"(a;b)"; t;', 's = R"(a;b)";'),
        # blocks the fill opens: balanced, nested
        ("{ a; { b; } c; }\n    d;", "{ a; { b; } c; }"),
        ("for (;;) { if (x) break; }\n y;", "for (;;) { if (x) break; }"),
        (
            "for (int i = 0; i < n; ++i)\n        acc += a[i];\n    y;",
            "for (int i = 0; i < n; ++i)\n        acc += a[i];",
        ),
        ("while (i < n) i += s;\n z;", "while (i < n) i += s;"),
        ("do { i++; } while (i < n);\n z;", "do { i++; } while (i < n);"),
        ("switch (k) { case 0: a; break; default: b; }\n z;", "switch (k) { case 0: a; break; default: b; }"),
        # if / else chains are one statement
        ("if (a) { x; } else if (b) y; else { z; }\n w;", "if (a) { x; } else if (b) y; else { z; }"),
        ("if (i < n) y[i] = x[i];\n    z;", "if (i < n) y[i] = x[i];"),
        (
            "if (i < n) {\n  y[i] = 0;\n}\nelse\n  y[i] = 1;\nq;",
            "if (i < n) {\n  y[i] = 0;\n}\nelse\n  y[i] = 1;",
        ),
        ("if constexpr (N > 1) { a; }\n b;", "if constexpr (N > 1) { a; }"),
        ("else { y = 1; }\n z;", "else { y = 1; }"),
        # lambdas and initialisers nest: their ';' and '}' end nothing
        ("auto f = [&](int i) { return i * 2; };\n g();", "auto f = [&](int i) { return i * 2; };"),
        ("float w[3] = {1.f, 2.f, 3.f};\n x;", "float w[3] = {1.f, 2.f, 3.f};"),
        ("struct P { float x; float y; };\n z;", "struct P { float x; float y; };"),
        # preprocessor lines stay with the statement after them; a ';' or '{' in them counts for nothing
        (
            "#pragma unroll\n    for (int k = 0; k < 4; ++k) s += v[k];\n    t;",
            "#pragma unroll\n    for (int k = 0; k < 4; ++k) s += v[k];",
        ),
        ("#define F(x) { x; }\nz = 1;\nq;", "#define F(x) { x; }\nz = 1;"),
        ("#if USE_FAST \\\n   && 1 ;\nz = 1;\nq;", "#if USE_FAST \\\n   && 1 ;\nz = 1;"),
        ("// compute\n    x = 1;\n    y;", "// compute\n    x = 1;"),
        # a closer that closes what the fill did not open ends it before the closer
        ("}\n    y = 2;", ""),
        ("x = 1\n}\n", "x = 1"),
        # slips of a small model: an unclosed '(' does not swallow the statement
        ("float s = logf(1.0f + expf(x);\n    y = 2;", "float s = logf(1.0f + expf(x);"),
        ("if (a) {\n  x = (b] + 1;\n}\nz;", "if (a) {\n  x = (b] + 1;\n}"),
        # stray empty statements before it do not make a fill
        (";\n    x = 1;\n y;", ";\n    x = 1;"),
    ],
)
def test_statement_end(fill: str, expected: str) -> None:
    assert cut(fill) == expected


@pytest.mark.parametrize(
    "fill",
    [
        "x = 1",  # no ';' yet
        "{ a; { b; }",  # unbalanced
        'printf("a;',  # unterminated string
        "x = 1 /* ; ",  # unterminated comment
        "#pragma unroll\n",  # only a directive
        "",
        "   \n ",
        ";;",
    ],
)
def test_statement_without_an_end(fill: str) -> None:
    assert shape_end(fill, "statement") is None
    assert cut_to_shape(fill, "statement") == (fill, False)


def test_pending_until_the_following_text_decides() -> None:
    # an if statement may still get an else: decided by the next token, or at the end of the text
    assert shape_end("if (a) x = 1;", "statement") is None
    assert shape_end("if (a) x = 1;", "statement", final=True) == len("if (a) x = 1;")
    assert shape_end("if (a) x = 1;\n  el", "statement") is None  # 'el' may become 'else'
    assert shape_end("if (a) x = 1;\n  y", "statement") is None  # a word at the very end may still grow
    assert shape_end("if (a) x = 1;\n  y ", "statement") == len("if (a) x = 1;")
    assert shape_end("if (a) x = 1;\n  else", "statement") is None
    assert shape_end("if (a) x = 1; /* c", "statement") is None  # the comment may hide an else after it
    assert shape_end("if (a) x = 1; /", "statement") is None  # a '/' may open a comment
    # a simple statement is decided by its ';', or by the line break after a comment that follows it
    assert shape_end("x = 1;", "statement") == 6
    assert shape_end("x = 1; // why", "statement") is None
    assert shape_end("x = 1; // why\n", "statement") == len("x = 1; // why")
    assert shape_end("x = 1; /* wh", "statement") is None
    assert shape_end("x = 1; // why", "statement", final=True) == len("x = 1; // why")
    # a word at the very end may be a keyword in the making ("fo" -> "for")
    assert shape_end("fo", "statement") is None


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        ("a[i] + b[i]);\n", "a[i] + b[i]"),
        ("x * 2;\n    y = 3;", "x * 2"),
        ("f(a, b), c)", "f(a, b)"),
        ("n - 1] = 0;", "n - 1"),
        ("1.f, 2.f}", "1.f"),
        ('"a,b)" + s)', '"a,b)" + s'),
        ("[&](int i) { return i; }(k))", "[&](int i) { return i; }(k)"),
        ("(a + b  ;", "(a + b"),
        (")", ""),
    ],
)
def test_expression_end(fill: str, expected: str) -> None:
    assert cut(fill, "expression") == expected


def test_expression_without_an_end() -> None:
    assert shape_end("a + (b", "expression") is None
    assert shape_end("a + b", "expression") is None
    assert cut_to_shape("a + b", "expression") == ("a + b", False)


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        ("threadIdx.x;\n    int j = 0;", "threadIdx.x;"),
        ("a, b);  // done\n  x;", "a, b);  // done"),
        ("\n  threadIdx.x;\n y", "\n  threadIdx.x;"),  # the line break before any code does not end it
        ('"a\\nb";\nx', '"a\\nb";'),
        ("x /* a\n b */ + 1;\n y", "x /* a\n b */ + 1;"),
    ],
)
def test_line_end(fill: str, expected: str) -> None:
    assert cut(fill, "line") == expected


def test_block_and_none_never_cut() -> None:
    text = "x = 1;\n y = 2;\n"
    for shape in ("block", None):
        assert shape_end(text, shape) is None and cut_to_shape(text, shape) == (text, False)


def test_cut_is_idempotent() -> None:
    fills = ["x = 1;\n y;", "if (a) { b; } else c;\n d;", "a, b", "q;\nz", "for (;;) {}\n"]
    for shape in ("statement", "expression", "line"):
        for fill in fills:
            once = cut_to_shape(fill, shape)[0]
            assert cut_to_shape(once, shape)[0] == once


def test_unknown_shape() -> None:
    assert set(SHAPES) == {"statement", "expression", "line", "block"}
    check_shape(None)
    with pytest.raises(ValueError, match="unknown hole shape 'lines'"):
        check_shape("lines")
    with pytest.raises(ValueError):
        shape_end("x;", "lines")


# ------------------------------------------------------------------------------------- Engine.infill
class ScriptedText:
    """The tiny model's tokenizer, except that ``decode`` shows the first ``4 * len(ids)`` characters of a
    script: what the model "wrote" after so many tokens, whatever ids it picked."""

    def __init__(self, inner: Any, script: str) -> None:
        self.inner = inner
        self.script = script

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decode(self, ids: list[int]) -> str:
        return self.script[: 4 * len(ids)]


SCRIPT = "x = 1;\n    y = 2;\n    z = 3;\n" + "    w = 4;\n" * 20


@pytest.fixture
def scripted(tiny_ckpt) -> Any:
    eng = load_engine(tiny_ckpt, device="cpu")
    eng.tokenizer = ScriptedText(eng.tokenizer, SCRIPT)
    return eng


def test_infill_stops_where_the_statement_ends(scripted) -> None:
    args = dict(max_new_tokens=48, stop_ids=[], block_size=4, steps_per_block=1)
    free = scripted.infill("int k;\n    ", "\n}\n", **args)[0]
    assert len(free.token_ids) == 48 and "y = 2;" in free.text and not free.finished
    shaped = scripted.infill("int k;\n    ", "\n}\n", shape="statement", **args)[0]
    assert shaped.text == "x = 1;" and shaped.finished
    assert len(shaped.token_ids) <= 8  # the row stopped at the first block boundary after the ';'
    line = scripted.infill("int k = ", "\n}\n", shape="line", **args)[0]
    assert line.text == "x = 1;" and len(line.token_ids) <= 8
    with pytest.raises(ValueError, match="unknown hole shape"):
        scripted.infill("a", "b", shape="lines", **args)


def test_infill_asks_the_callers_until_too(scripted) -> None:
    asked: list[int] = []

    def until(row: int, ids: list[int]) -> bool:
        asked.append(len(ids))
        return len(ids) >= 12

    args = dict(max_new_tokens=48, stop_ids=[], block_size=4, steps_per_block=1)
    out = scripted.infill("int k;\n    ", "\n}\n", until=until, **args)[0]
    assert asked and len(out.token_ids) <= 16 and out.finished
    # the shape still ends it first when it comes first
    out = scripted.infill("int k;\n    ", "\n}\n", until=until, shape="statement", **args)[0]
    assert out.text == "x = 1;"
    # the suffix still ends it: "y = 2;" is the suffix's first line here
    out = scripted.infill("int k;\n    ", "\n    y = 2;\n}\n", **args)[0]
    assert out.text == "x = 1;" and out.finished and len(out.token_ids) < 48
