"""The shape of a hole, from the mask's place in the file: how much code its fill may hold.

``engine.shape`` ends the fill (and the decoder) where the shape says; this module only decides the shape.
Copilot's single-line completion is the model: a mask alone on its line is one statement, a mask inside an
expression is an expression, an empty body is a block.

- "block": the mask is the whole body of a ``{ }`` pair (nothing but blanks and comments between the
  braces and it), or it lies outside every function: no cut but the suffix (today's behaviour).
- "statement": the mask is alone on its line(s), or it sits where a statement starts (after ``;``, ``{``,
  ``}``, ``else``, ``do`` or the ``)`` of an ``if``/``for``/``while`` head) and what follows it on the
  line is nothing, a ``}``, a comment or the next statement's first word.
- "line": after code on its line, with nothing but blanks or a comment after it: the rest of that line.
- "expression": anything else (inside an expression or an argument list).

The implicit hole at a cursor (zero width) follows the same rule: on an otherwise blank line it is a
statement hole.
"""

from __future__ import annotations

import re
from typing import Literal

HoleShape = Literal["statement", "expression", "line", "block"]

# an if/for/while head ending at the mask: `if (i < n) /* <MASK> */`, `} else if (c)`
_CONTROL_HEAD = re.compile(r"^(?:\}\s*)?(?:else\s+)?(?:if|for|while)\s*\(")
_ENDS_WITH_KEYWORD = re.compile(r"(?:^|\W)(?:else|do)$")
_TRAILING_BLOCK_COMMENTS = re.compile(r"(?:\s*/\*.*?\*/)+\s*$")
_BLANKS = b" \t\r\n\f\v"


def hole_shape(data: bytes, start: int, end: int, *, in_function: bool = True) -> HoleShape:
    """The shape of the hole ``data[start:end]`` (UTF-8 bytes of the file; ``start == end`` for a cursor).

    ``in_function``: the hole lies inside a function (a hole outside every function is "block").
    """
    if not in_function:
        return "block"
    if _previous_char(data, start) == b"{" and _next_char(data, end) == b"}":
        return "block"
    line_start = data.rfind(b"\n", 0, start) + 1
    newline = data.find(b"\n", end)
    before = data[line_start:start].decode("utf-8", "replace")
    after = data[end : len(data) if newline < 0 else newline].decode("utf-8", "replace").strip()
    code_before = _TRAILING_BLOCK_COMMENTS.sub("", before).strip()
    if not code_before and not after:
        return "statement"
    after_is_comment = after.startswith(("//", "/*"))
    if _statement_starts_after(code_before) and (
        not after or after_is_comment or after[0] == "}" or after[0] == "_" or after[0].isalpha()
    ):
        return "statement"
    if not after or after_is_comment:
        return "line"
    return "expression"


def _statement_starts_after(code: str) -> bool:
    """``code`` (the line before the hole) ends where a statement may start."""
    if not code or code[-1] in ";{}":
        return True
    if _ENDS_WITH_KEYWORD.search(code):
        return True
    return code[-1] == ")" and bool(_CONTROL_HEAD.match(code)) and code.count("(") == code.count(")")


def _previous_char(data: bytes, pos: int) -> bytes | None:
    """The last character before ``pos`` that is neither blank nor in a comment (a ``//`` on a line is
    taken for a comment; good enough for a brace check), or None at the start of the file."""
    i = pos
    while True:
        while i > 0 and data[i - 1] in _BLANKS:
            i -= 1
        if i == 0:
            return None
        line_begin = data.rfind(b"\n", 0, i) + 1
        comment = data.find(b"//", line_begin, i)
        if comment >= 0:
            i = comment
            continue
        if data.endswith(b"*/", 0, i):
            opening = data.rfind(b"/*", 0, i - 2)
            if opening >= 0:
                i = opening
                continue
        return data[i - 1 : i]


def _next_char(data: bytes, pos: int) -> bytes | None:
    """The first character at or after ``pos`` that is neither blank nor in a comment (None at the end)."""
    i = pos
    n = len(data)
    while True:
        while i < n and data[i] in _BLANKS:
            i += 1
        if i >= n:
            return None
        if data.startswith(b"//", i):
            newline = data.find(b"\n", i)
            i = n if newline < 0 else newline
            continue
        if data.startswith(b"/*", i):
            close = data.find(b"*/", i + 2)
            i = n if close < 0 else close + 2
            continue
        return data[i : i + 1]
