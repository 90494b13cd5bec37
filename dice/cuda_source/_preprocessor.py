"""Preprocessor directives read from the raw bytes: tree-sitter keeps a macro body as one opaque token (and
mis-lexes some, e.g. a ``/*`` inside a string literal of a ``#define``), so the lines that start with ``#``
are lexed here: where each directive ends (backslash continuations), and which bytes of it are string or
character literals."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import tree_sitter

# What the top-level scan stops at: comments, literals and a `#` that starts a line.
_TOP = re.compile(rb'//|/\*|"|\'|^[ \t]*#', re.M)
# What a directive's own scan stops at: literals, comments, continuations and line ends.
_IN_DIRECTIVE = re.compile(rb'"|\'|/\*|//|\\\r?\n|\\\r|\r?\n|\r')
_STRING = re.compile(rb'"(?:[^"\\\r\n]|\\(?:\r\n|.))*"?', re.S)
_CHAR = re.compile(rb"'(?:[^'\\\r\n]|\\(?:\r\n|.))*'?", re.S)
_BREAK = re.compile(rb"\r\n|\r|\n")
_KEYWORD = re.compile(rb"#[ \t]*([A-Za-z_]\w*)")
_DEFINE_NAME = re.compile(rb"#[ \t]*define[ \t]+([A-Za-z_]\w*)")
_IDENT_CHAR = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_RAW_PREFIXES = (b"R", b"LR", b"uR", b"UR", b"u8R")
_CHAR_PREFIXES = (b"L", b"u", b"U", b"u8")
_LITERAL_NODES = frozenset(
    {"comment", "string_literal", "string_content", "raw_string_literal", "char_literal"}
)


@dataclass(frozen=True)
class Directive:
    """One logical directive line: ``start`` is its ``#``, ``end`` the line break that ends it (exclusive;
    continuation lines included); ``literals`` are the (start, end) byte spans of its string and character
    literals."""

    start: int
    end: int
    keyword: str
    literals: tuple[tuple[int, int], ...] = field(default=())


def _word_before(data: bytes, i: int) -> bytes:
    j = i
    while j > 0 and data[j - 1] in _IDENT_CHAR:
        j -= 1
    return data[j:i]


def skip_literal(data: bytes, i: int) -> tuple[int, bool]:
    """``data[i]`` is a quote: the end of the literal it opens, and whether it is one (a ``'`` inside a
    number such as ``1'000`` is a digit separator, not a literal)."""
    prefix = _word_before(data, i)
    if data[i : i + 1] == b'"':
        if prefix in _RAW_PREFIXES:
            open_paren = data.find(b"(", i + 1, i + 20)
            if open_paren != -1:
                closer = b")" + data[i + 1 : open_paren] + b'"'
                end = data.find(closer, open_paren + 1)
                return (len(data) if end == -1 else end + len(closer)), True
        match = _STRING.match(data, i)
        return (match.end() if match else i + 1), True
    if prefix and prefix not in _CHAR_PREFIXES:
        return i + 1, False
    match = _CHAR.match(data, i)
    return (match.end() if match else i + 1), True


def _line_end(data: bytes, i: int) -> int:
    """The line break that ends the (backslash-continued) line holding ``i``, or the end of the data."""
    while True:
        match = _BREAK.search(data, i)
        if match is None:
            return len(data)
        before = data[max(0, match.start() - 1) : match.start()]
        if before != b"\\":
            return match.start()
        i = match.end()


def lex_directive(data: bytes, start: int) -> Directive:
    """The directive whose ``#`` is at ``start``."""
    literals: list[tuple[int, int]] = []
    pos, end = start + 1, len(data)
    while True:
        match = _IN_DIRECTIVE.search(data, pos)
        if match is None:
            break
        token = match.group()
        if token.startswith(b"\\"):
            pos = match.end()
        elif token in (b"\n", b"\r\n", b"\r"):
            end = match.start()
            break
        elif token == b"/*":
            close = data.find(b"*/", match.end())
            pos = len(data) if close == -1 else close + 2
        elif token == b"//":
            end = _line_end(data, match.end())
            break
        else:
            literal_end, is_literal = skip_literal(data, match.start())
            if is_literal:
                literals.append((match.start(), literal_end))
            pos = literal_end
    keyword = _KEYWORD.match(data, start)
    return Directive(start, end, keyword.group(1).decode() if keyword else "", tuple(literals))


def scan_directives(data: bytes) -> list[Directive]:
    """Every directive of the file, in order; ``#`` inside comments and literals is not one."""
    found: list[Directive] = []
    pos = 0
    while True:
        match = _TOP.search(data, pos)
        if match is None:
            return found
        token = match.group()
        if token.endswith(b"#"):
            directive = lex_directive(data, match.end() - 1)
            found.append(directive)
            pos = max(directive.end, match.end())
        elif token == b"//":
            pos = _line_end(data, match.end())
        elif token == b"/*":
            close = data.find(b"*/", match.end())
            pos = len(data) if close == -1 else close + 2
        else:
            pos = skip_literal(data, match.start())[0]


def define_names(data: bytes, directives: list[Directive]) -> set[str]:
    """Names of the macros the file ``#define``s."""
    names = set()
    for directive in directives:
        if directive.keyword == "define":
            match = _DEFINE_NAME.match(data, directive.start)
            if match:
                names.add(match.group(1).decode())
    return names


def in_macro_literal(data: bytes, root: tree_sitter.Node, offset: int) -> bool:
    """Whether byte ``offset`` lies inside a string or character literal of a preprocessor directive.

    The logical line holding ``offset`` is found by walking back over backslash continuations; it is a
    directive when its first non-blank byte is a ``#`` that the tree does not put inside a comment or a
    literal (a ``#define`` line inside a block comment is not a directive).
    """
    line_start = _line_start(data, offset)
    while line_start > 0:
        previous = _line_start(data, line_start - 1 - (data[line_start - 2 : line_start] == b"\r\n"))
        if data[previous:line_start].rstrip(b"\r\n").endswith(b"\\"):
            line_start = previous
        else:
            break
    hash_at = line_start
    while hash_at < offset and data[hash_at : hash_at + 1] in (b" ", b"\t"):
        hash_at += 1
    if data[hash_at : hash_at + 1] != b"#":
        return False
    node = root.descendant_for_byte_range(hash_at, hash_at + 1)
    if node is not None and node.type in _LITERAL_NODES and node.start_byte < hash_at:
        return False
    directive = lex_directive(data, hash_at)
    return any(start < offset < end for start, end in directive.literals)


def _line_start(data: bytes, i: int) -> int:
    # Look for a CR only after the last LF: in an LF-only file an unbounded rfind(b"\r") scans back to the
    # start of the file on every call, quadratic over the masks of a big file (200k masks: 6 s).
    newline = data.rfind(b"\n", 0, i)
    return max(newline, data.rfind(b"\r", newline + 1, i)) + 1


def group_end(data: bytes, open_paren: int, limit: int = 4096) -> int | None:
    """The end (after the ``)``) of the parenthesised group that opens at ``open_paren``, skipping
    literals; None when a ``;``, ``{`` or ``}`` comes first or the group runs past ``limit`` bytes."""
    depth = 0
    i = open_paren
    while i < len(data) and i - open_paren < limit:
        ch = data[i : i + 1]
        if ch in (b'"', b"'"):
            i = skip_literal(data, i)[0]
            continue
        if ch in (b";", b"{", b"}"):
            return None
        if ch == b"(":
            depth += 1
        elif ch == b")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


_NAMESPACE_BODY = re.compile(rb"(?:namespace[ \t]+[A-Za-z_][\w:]*[ \t]*\{|\}(?:[ \t]*\})*)[ \t]*")
_DEFINE_BODY = re.compile(rb"#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+(.*)", re.S)
_ALONE = re.compile(rb"^[ \t]*([A-Za-z_]\w*)[ \t]*(?://[^\r\n]*)?$", re.M)


def namespace_macro_uses(data: bytes, directives: list[Directive]) -> list[tuple[int, int]]:
    """Uses, each alone on its line, of macros that open or close a namespace (``#define BEGIN_NS
    namespace mgpu {``, ``#define END_NS }``, or an ALL_CAPS word with ``NAMESPACE`` in it when the
    definition is in a header). tree-sitter reads ``END_NS`` and the next item as one declaration."""
    names: set[bytes] = set()
    for directive in directives:
        match = (
            _DEFINE_BODY.match(data, directive.start, directive.end)
            if directive.keyword == "define"
            else None
        )
        if match and _NAMESPACE_BODY.fullmatch(match.group(2).strip()):
            names.add(match.group(1))
    if not names and b"NAMESPACE" not in data:
        return []
    starts = [d.start for d in directives]
    uses = []
    for match in _ALONE.finditer(data):
        word = match.group(1)
        if word in names or (b"NAMESPACE" in word and word.upper() == word):
            i = bisect.bisect_right(starts, match.start(1)) - 1
            if i < 0 or directives[i].end <= match.start(1):
                uses.append((match.start(1), match.end(1)))
    return uses


_CONDITIONAL_KEYWORDS = frozenset({"if", "ifdef", "ifndef"})


def brace_only_conditionals(data: bytes, directives: list[Directive]) -> list[tuple[int, int]]:
    """Bodies of conditional blocks that hold only ``extern "C" {`` or ``}`` (``#ifdef __cplusplus``
    around a C header): braces tree-sitter cannot pair across the two blocks."""
    spans = []
    for i, directive in enumerate(directives):
        if directive.keyword in _CONDITIONAL_KEYWORDS:
            following = directives[i + 1].start if i + 1 < len(directives) else len(data)
            if data[directive.end : following].strip() in (b'extern "C" {', b"}"):
                spans.append((directive.end, following))
    return spans


def lexed_inside_literal(data: bytes, start: int, offset: int) -> bool:
    """Whether byte ``offset`` is inside a string, character or raw-string literal (or a comment) when the
    bytes from ``start`` (a token boundary outside any literal) are lexed as C++ tokens.

    tree-sitter's error recovery can lex the inside of a literal as code: ``x'<'R"(a /* <MASK> */)"`` gives an
    ERROR node holding a ``comment`` that is really inside the raw string. Masks found inside an ERROR node
    are checked here; a plain scan (no tree-sitter API exposes its lexer state), linear in the bytes scanned.
    """
    i, n = start, min(offset, len(data))
    while i < n:
        c = data[i : i + 1]
        if data.startswith(b"//", i):
            end = data.find(b"\n", i)
            if end == -1 or end >= offset:
                return True
            i = end + 1
        elif data.startswith(b"/*", i):
            end = data.find(b"*/", i + 2)
            if end == -1 or end + 2 > offset:
                return True
            i = end + 2
        elif c == b'"' and i > 0 and data[i - 1 : i] == b"R" and not _ident_byte(data, i - 2):
            match = _RAW_OPEN.match(data, i + 1)
            if match is None:
                i += 1
                continue
            close = b")" + match.group(1) + b'"'
            end = data.find(close, match.end())
            if end == -1 or end + len(close) > offset:
                return True
            i = end + len(close)
        elif c in (b'"', b"'"):
            i += 1
            while i < len(data) and data[i : i + 1] not in (c, b"\n"):
                i += 2 if data[i : i + 1] == b"\\" else 1
            if i >= offset:
                return True
            i += 1
        else:
            i += 1
    return False


_RAW_OPEN = re.compile(rb'([^()\\\s"]{0,16})\(')


def _ident_byte(data: bytes, i: int) -> bool:
    return i >= 0 and (data[i : i + 1].isalnum() or data[i : i + 1] == b"_")
