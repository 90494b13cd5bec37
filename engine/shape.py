"""Where a fill ends, given the shape of its hole: the rule that stops the decoder and cuts the middle.

A hole's shape says how much code belongs in it (``dice.assistant.shape.hole_shape`` decides it from the
mask's place in the file):

- "statement" (a mask alone on its line): one complete statement at the top nesting level: through the
  first ``;`` outside braces (the braces of a lambda or an initialiser nest; a ``(`` left open by a slip
  does not hold it), or a balanced ``{...}`` block the fill opens; ``if (...) S [else S]`` chains,
  ``for``/``while``/``switch (...) S`` and ``do S while (...);`` count as one. Leading comments,
  preprocessor lines (``#pragma unroll``) and stray ``;`` stay with the statement that follows them;
  comments on its last line stay with it.
- "expression" (a mask inside an expression or an argument list): up to, not including, the delimiter that
  would close the enclosing expression: a ``)``/``]``/``}`` that closes nothing the fill opened, a ``,``
  outside brackets, or a ``;`` outside braces.
- "line" (a mask after code, at the end of its line): the rest of the line, up to the first line break
  after some code.
- "block" or None (a mask that is a whole body, code outside functions): no end but the suffix.

Strings, character literals, comments and preprocessor lines are skipped, so a ``;`` in them ends
nothing. The text is C/C++/CUDA as a model writes it: nothing here needs it to be well formed; an unbalanced
closer where a statement should start ends the fill before it. Pure text: no model, no tree-sitter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

HoleShape = Literal["statement", "expression", "line", "block"]
SHAPES: tuple[str, ...] = ("statement", "expression", "line", "block")

_OPENERS = "([{"
_CLOSERS = ")]}"
_OPENER_OF = {")": "(", "]": "[", "}": "{"}
_WORD = re.compile(r"[\w$]+")
_NUMBER = re.compile(r"\.?\d(?:[eEpP][+-]|[\w.'])*")
_RAW_PREFIXES = ("R", "LR", "uR", "UR", "u8R")


@dataclass(frozen=True)
class _Token:
    value: str  # the word, or the punctuation character; '"' for a string or character literal
    start: int
    end: int


@dataclass(frozen=True)
class _Lexed:
    tokens: list[_Token]  # significant tokens: no comments, no preprocessor lines
    newlines: list[int]  # offsets of line breaks outside comments and literals


def check_shape(shape: str | None) -> None:
    """ValueError for a shape that is neither None nor one of ``SHAPES``."""
    if shape is not None and shape not in SHAPES:
        raise ValueError(f"unknown hole shape {shape!r} (use one of {', '.join(SHAPES)})")


def shape_end(text: str, shape: str | None, *, final: bool = False) -> int | None:
    """The offset in ``text`` where a fill of a ``shape`` hole ends, or None when it does not end (yet).

    ``final``: no more text will come, so the end of ``text`` ends a statement that could still have been
    continued (``if (c) x = 1;`` then, perhaps, ``else``); otherwise such an end is only reported once the
    text that follows it is seen. A statement or line keeps the comments that follow it on its last line
    (``x = 1;  // why``); blanks after the end are not part of the fill.
    """
    check_shape(shape)
    if shape is None or shape == "block":
        return None
    lexed = _lex(text, final=final)
    if shape == "line":
        end = _line_end(lexed)
        return None if end is None else _after_comments(text, end, final)
    toks = lexed.tokens
    parser = _Parser(toks, final)
    if shape == "expression":
        last = parser.expression(0)
        return None if last is None else (toks[last - 1].end if last > 0 else toks[0].start)
    # stray `;` before the statement (empty statements) do not make a fill of their own
    first = next((k for k, t in enumerate(toks) if t.value != ";"), len(toks))
    last = parser.statement(first)
    if last is None:
        return None
    return _after_comments(text, toks[last - 1].end, final) if last > 0 else toks[0].start


def _after_comments(text: str, end: int, final: bool) -> int | None:
    """``end`` moved past the comments that follow it on its line (None: a ``//`` comment whose line
    break has not come yet, unless ``final``)."""
    n = len(text)
    while True:
        j = end
        while j < n and text[j] in " \t":
            j += 1
        if text.startswith("//", j):
            brk = text.find("\n", j)
            if brk < 0 and not final:
                return None
            return len(text[: n if brk < 0 else brk].rstrip())
        if not text.startswith("/*", j):
            return end
        close = text.find("*/", j + 2)
        if close < 0 or "\n" in text[j:close]:  # unterminated, or a comment over several lines: not kept
            return None if close < 0 and not final else end
        end = close + 2


def cut_to_shape(text: str, shape: str | None) -> tuple[str, bool]:
    """(the fill ``text`` cut where its hole's shape ends, whether such an end was found); the text as it
    is when none was (it ran out first, or the shape is "block"/None)."""
    end = shape_end(text, shape, final=True)
    return (text, False) if end is None else (text[:end], True)


def open_brackets(text: str) -> int:
    """How many ``(``, ``[`` and ``{`` ``text`` leaves open (strings, comments and preprocessor lines
    skipped; a closer with nothing open is ignored): a fill that still has a bracket open cannot have
    ended, so a suffix that starts with a closer is not found inside it."""
    stack: list[str] = []
    for tok in _lex(text, final=True).tokens:
        if tok.value in _OPENERS:
            stack.append(tok.value)
        elif tok.value in _CLOSERS and stack:
            _close(stack, tok.value)
    return len(stack)


def _line_end(lexed: _Lexed) -> int | None:
    toks = lexed.tokens
    if not toks:
        return None
    first = toks[0].start
    brk = next((p for p in lexed.newlines if p > first), None)
    if brk is None:
        return None
    return max(t.end for t in toks if t.end <= brk)


class _Parser:
    """Statement and expression ends over a token list; methods return the index of the first token after
    the construct (a closer that ends it early is not consumed), or None when the tokens run out first."""

    def __init__(self, toks: list[_Token], final: bool) -> None:
        self.toks = toks
        self.final = final

    def value(self, i: int) -> str | None:
        return self.toks[i].value if i < len(self.toks) else None

    def statement(self, i: int) -> int | None:
        v = self.value(i)
        if v is None:
            return None
        if v in _CLOSERS:  # the fill closes a block it did not open: it ends before the closer
            return i
        if v == "{":
            return self.group_end(i)
        if v == ";":
            return i + 1
        if v in ("if", "for", "while", "switch"):
            return self.control(i)
        if v == "do":
            body = self.statement(i + 1)
            return None if body is None else self.until_semicolon(body)
        if v == "else":  # a fill that continues the if of the prefix
            return self.statement(i + 1)
        return self.until_semicolon(i)

    def control(self, i: int) -> int | None:
        """``if [constexpr] (...) S [else S]``, ``for|while|switch (...) S``."""
        keyword = self.value(i)
        j = i + 1
        if keyword == "if" and self.value(j) == "constexpr":
            j += 1
        if self.value(j) is None:
            return None
        if self.value(j) != "(":
            return self.until_semicolon(i)
        head = self.group_end(j)
        if head is None:
            return None
        body = self.statement(head)
        if body is None or keyword != "if" or body == head:
            return body
        following = self.value(body)
        if following is None:
            return body if self.final else None
        return self.statement(body + 1) if following == "else" else body

    def group_end(self, i: int) -> int | None:
        """After the closer that closes the opener at ``i`` (see ``_close``)."""
        stack: list[str] = []
        for j in range(i, len(self.toks)):
            v = self.toks[j].value
            if v in _OPENERS:
                stack.append(v)
            elif v in _CLOSERS:
                if not _close(stack, v):
                    return j
                if not stack:
                    return j + 1
        return None

    def until_semicolon(self, i: int) -> int | None:
        """A simple statement: through the first ``;`` outside braces (the braces of a lambda or an
        initialiser nest; a ``(`` left open does not hold a ``;``: only a ``for`` head does, and that is
        not a simple statement); before a closer that closes something the fill did not open."""
        return self._scan(i, stops=";", keep_stop=True)

    def expression(self, i: int) -> int | None:
        """Before the first ``,`` outside brackets, ``;`` outside braces, or closer of something the fill
        did not open."""
        return self._scan(i, stops=",;", keep_stop=False)

    def _scan(self, i: int, *, stops: str, keep_stop: bool) -> int | None:
        stack: list[str] = []
        for j in range(i, len(self.toks)):
            v = self.toks[j].value
            if v in _OPENERS:
                stack.append(v)
            elif v in _CLOSERS:
                if not _close(stack, v):
                    return j
            elif v in stops and (not stack or (v == ";" and "{" not in stack)):
                return j + 1 if keep_stop else j
        return None


def _close(stack: list[str], closer: str) -> bool:
    """Apply ``closer`` to the open brackets ``stack``: it closes its opener and whatever is open inside
    it, but only ``}`` closes a ``{``; a ``)`` or ``]`` that matches nothing inside an open bracket is
    ignored. False when it closes something the fill did not open (nothing is open, or a ``}`` and no
    ``{`` is): the fill ends before it."""
    opener = _OPENER_OF[closer]
    for k in range(len(stack) - 1, -1, -1):
        if stack[k] == opener:
            del stack[k:]
            return True
        if stack[k] == "{":
            return True
    return bool(stack) and closer != "}"


def _lex(text: str, *, final: bool) -> _Lexed:
    """Significant tokens and line breaks of ``text``. Not ``final``: a last token that more text could
    still change (a word or number at the very end, an unterminated literal, comment or preprocessor line,
    a lone ``/``) is left out, so nothing is decided on it."""
    tokens: list[_Token] = []
    newlines: list[int] = []
    n = len(text)
    i = 0
    line_start = True  # only blanks since the last line break (or the start): a '#' opens a directive
    while i < n:
        c = text[i]
        if c == "\n":
            newlines.append(i)
            line_start = True
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "#" and line_start:
            end = _directive_end(text, i)
            if end >= n and not final:
                break
            i = end
            continue
        line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                break
            i = end + 2
            continue
        token, complete = _token_at(text, i)
        if not complete and not final:
            break
        tokens.append(token)
        i = token.end
    return _Lexed(tokens, newlines)


def _token_at(text: str, i: int) -> tuple[_Token, bool]:
    """The token starting at ``i`` and whether it is surely complete."""
    n = len(text)
    c = text[i]
    if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
        m = _NUMBER.match(text, i)
        end = m.end() if m else i + 1
        return _Token("0", i, end), end < n
    if c.isalpha() or c in "_$":
        m = _WORD.match(text, i)
        end = m.end() if m else i + 1
        word = text[i:end]
        if word in _RAW_PREFIXES and end < n and text[end] == '"':
            stop, complete = _raw_string_end(text, end)
            return _Token('"', i, stop), complete
        if end < n and text[end] in "'\"" and word in ("L", "u", "U", "u8"):
            stop, complete = _literal_end(text, end)
            return _Token('"', i, stop), complete
        return _Token(word, i, end), end < n
    if c in "'\"":
        stop, complete = _literal_end(text, i)
        return _Token('"', i, stop), complete
    # a lone '/' at the end may be the start of a comment
    return _Token(c, i, i + 1), not (c == "/" and i + 1 == n)


def _literal_end(text: str, i: int) -> tuple[int, bool]:
    """End of the string or character literal opening at ``i``; an unescaped line break ends it too
    (unterminated), as does the end of the text (then not complete)."""
    quote = text[i]
    j = i + 1
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            return j + 1, True
        if c == "\n":
            return j, True
        j += 1
    return n, False


def _raw_string_end(text: str, quote: int) -> tuple[int, bool]:
    """End of a raw string literal ``R"delim( ... )delim"`` whose quote is at ``quote``."""
    paren = text.find("(", quote + 1)
    if paren < 0:
        return len(text), False
    closing = ")" + text[quote + 1 : paren] + '"'
    end = text.find(closing, paren + 1)
    return (len(text), False) if end < 0 else (end + len(closing), True)


def _directive_end(text: str, i: int) -> int:
    """The line break that ends the preprocessor line starting at ``i`` (a ``\\`` before a line break
    continues it), or the end of the text."""
    n = len(text)
    j = i
    while True:
        brk = text.find("\n", j)
        if brk < 0:
            return n
        if text[i:brk].rstrip("\r").endswith("\\"):
            j = brk + 1
            continue
        return brk
