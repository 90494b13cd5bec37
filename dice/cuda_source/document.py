"""Masks, functions and the ``dice-spec`` block of a CUDA source file, found with tree-sitter-cuda.

A mask is a comment whose whole text is ``<MASK>`` or ``<MASK:N>`` (``/* */`` or ``//``, any surrounding
whitespace); comments are tokens of the grammar, so text inside string literals is never a mask, and a
comment that tree-sitter finds inside a string literal of a ``#define`` body (which it does not parse) is
lexed out again. A comment that starts like a mask but is not one (``<MASK:0>``, ``<MASK:abc>``) is a
:class:`MalformedMask`, reported with the reason. The enclosing function comes from the syntax tree; while
the user types (unbalanced braces, ERROR nodes) a function is recovered from the pieces tree-sitter left
inside the ERROR node, and when even that fails the mask is still reported, with ``function=None``.
"""

from __future__ import annotations

import bisect
import functools
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

import tree_sitter

from dice.cuda_source._preprocessor import in_macro_literal, lexed_inside_literal
from dice.cuda_source._syntax import (
    COMMENT_QUERY,
    DECLARATOR_WRAPPERS,
    EXECUTION_SPACES,
    FunctionKind,
    function_declarator,
    kind_from_specifiers,
    node_text,
    parse_bytes,
    qualifier_macros,
    scan_scopes,
)
from dice.cuda_source._syntax_errors import has_unexplained_errors
from dice.cuda_source.positions import PositionIndex, Range, encode_text

# The regexes only ever see the text of one comment node; the C++ itself is parsed by tree-sitter.
_MASK_COMMENT = re.compile(r"(?:/\*\s*<MASK(?::\s*([0-9]+)\s*)?>\s*\*/|//\s*<MASK(?::\s*([0-9]+)\s*)?>\s*)")
# A comment whose text starts with `<MASK` not followed by a letter, digit or `_` is meant as a mask.
_MASK_ATTEMPT = re.compile(r"<MASK(?![A-Za-z0-9_])")
_BUDGET = re.compile(r":([^>]*)(>?)(.*)", re.S)
_DIGITS = re.compile(r"[0-9]+")
_SPEC_HEADER = re.compile(r"\s*dice-spec\b:?")

# Node types that may precede a function declarator in a (possibly broken) declaration.
_DECL_SPECIFIER_TYPES = EXECUTION_SPACES | {
    "__forceinline__",
    "__noinline__",
    "primitive_type",
    "type_identifier",
    "sized_type_specifier",
    "type_qualifier",
    "storage_class_specifier",
    "launch_bounds",
    "template_type",
    "qualified_identifier",
    "virtual",
    "attribute_specifier",
    "attribute_declaration",
    "placeholder_type_specifier",
    "identifier",
    "struct_specifier",
    "class_specifier",
    "enum_specifier",
    "explicit_function_specifier",
}
_MANY_HITS = 256


@dataclass(frozen=True)
class FunctionInfo:
    """A function definition. ``start_byte`` includes a ``template<...>`` header. ``recovered`` marks a
    definition that is not closed yet (rebuilt from an ERROR node, or closed by a MISSING brace): its body
    ends where tree-sitter's error recovery ended it, or at the end of the file when only blanks follow.
    ``is_template``: the body is template code, compiled only when something instantiates it: the
    definition has a ``template<...>`` header with parameters, or it is a member of a class template. An
    explicit specialisation (``template <>``) is an ordinary function.
    """

    name: str
    kind: FunctionKind
    signature: str
    start_byte: int
    end_byte: int
    body_start_byte: int
    body_end_byte: int
    recovered: bool = False
    is_template: bool = False

    def contains(self, byte_offset: int) -> bool:
        """``start_byte <= byte_offset < end_byte``; an unclosed (recovered) function also holds its end,
        where the cursor of someone typing at the end of the file is."""
        if self.recovered and byte_offset == self.end_byte:
            return True
        return self.start_byte <= byte_offset < self.end_byte


@dataclass(frozen=True)
class Mask:
    """One ``<MASK>`` comment. ``start_byte``/``end_byte`` are the comment's bytes (a ``//`` mask's range
    stops before the line break, CR included); ``range`` is the same span in LSP form."""

    index: int
    start_byte: int
    end_byte: int
    range: Range
    budget: int | None
    function: str | None
    kind: FunctionKind | None
    signature: str | None
    function_start_byte: int | None
    function_end_byte: int | None

    def to_json(self) -> dict[str, Any]:
        """The object ``dice masks --json`` prints for this mask (docs/CONTRACTS.md)."""
        return {
            "range": self.range.to_json(),
            "budget": self.budget,
            "function": self.function,
            "kind": self.kind,
        }


@dataclass(frozen=True)
class MalformedMask:
    """A comment that starts like a mask (``<MASK`` not followed by a letter, digit or ``_``) but is not
    one: ``<MASK:0>``, ``<MASK:abc>``, ``<MASK:48`` or ``<MASK> text``. It is not a mask (no index, never
    filled); ``reason`` says what is wrong, e.g. "a budget must be a positive integer, got 0". ``text`` is
    the comment, with the same bounds as a mask's (a ``//`` comment stops before its line break)."""

    start_byte: int
    end_byte: int
    range: Range
    text: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"range": self.range.to_json(), "text": self.text, "reason": self.reason}


@dataclass(frozen=True)
class DiceSpec:
    """The Python source of the file's first ``dice-spec`` block comment (``/* dice-spec ... */``), dedented,
    newlines normalised to ``\\n``; lines are otherwise verbatim (no `` * `` gutter is stripped). Text after
    ``dice-spec`` on the opening line, if any, is the source's first line.

    ``line_offset`` is the 0-based file line of the source's first line, so a Python error on line ``k``
    (1-based) of the spec is on file line ``line_offset + k - 1``.
    """

    source: str
    start_byte: int
    end_byte: int
    range: Range
    line_offset: int = 0


@dataclass(frozen=True)
class CudaDocument:
    """A parsed ``.cu``/``.cuh`` file. ``tree_has_errors`` is tree-sitter's own flag (an ERROR or MISSING
    node anywhere, unexpanded macros included); :attr:`has_errors` is the one to show a user."""

    text: str
    masks: list[Mask]
    spec: DiceSpec | None
    functions: list[FunctionInfo]
    tree_has_errors: bool = False
    index: PositionIndex = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    malformed_masks: list[MalformedMask] = field(default_factory=list)

    @property
    def data(self) -> bytes:
        """The UTF-8 bytes every byte offset of this document refers to."""
        return self.index.data

    @functools.cached_property
    def has_errors(self) -> bool:
        """A syntax error that no unexpanded macro or preprocessor conditional explains
        (``dice.cuda_source._syntax_errors``); a function left open while the user types counts. Computed
        on first use (it may parse the file again, a few times on macro-heavy files)."""
        if not self.tree_has_errors:
            return False
        data = self.data if self.index is not None else encode_text(self.text)
        return has_unexplained_errors(data, parse_bytes(data).root_node)


def parse_document(text: str | bytes) -> CudaDocument:
    """Parse CUDA source. Never raises on junk: bytes that are not UTF-8 are decoded with U+FFFD."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "replace")
    data = encode_text(text)
    index = PositionIndex(data)
    tree = parse_bytes(data)
    root = tree.root_node
    scope = scan_scopes(root)
    macros = qualifier_macros(scope.macros, data)
    functions = [
        info
        for node, top, generic in scope.functions
        if (info := _function_info(node, top, generic, data, macros))
    ]
    functions += _recover_functions(scope.errors, data, macros)
    functions.sort(key=lambda f: (f.start_byte, -f.end_byte))  # outer before inner, as _innermost needs
    masks: list[Mask] = []
    malformed: list[MalformedMask] = []
    for node in _comments_containing(root, data, b"<MASK"):
        if in_macro_literal(data, root, node.start_byte):
            continue  # tree-sitter lexed a comment inside a string literal of a #define body
        if _recovered_inside_literal(node, data):
            continue
        found = _mask_from_comment(node, data, len(masks), index, functions)
        if isinstance(found, Mask):
            masks.append(found)
        elif found is not None:
            malformed.append(found)
    spec = None
    for node in _comments_containing(root, data, b"dice-spec"):
        spec = _spec_from_comment(node, data, index)
        if spec is not None:
            break
    return CudaDocument(
        text=text,
        masks=masks,
        spec=spec,
        functions=functions,
        tree_has_errors=root.has_error,
        index=index,
        malformed_masks=malformed,
    )


def function_at(doc: CudaDocument, byte_offset: int) -> FunctionInfo | None:
    """The innermost function whose span ``[start_byte, end_byte)`` contains ``byte_offset``."""
    return _innermost(doc.functions, byte_offset)


def _innermost(functions: list[FunctionInfo], byte_offset: int) -> FunctionInfo | None:
    i = bisect.bisect_right(functions, byte_offset, key=lambda f: f.start_byte) - 1
    # Functions are sorted by start; among those containing the offset the innermost starts last.
    while i >= 0:
        if functions[i].contains(byte_offset):
            return functions[i]
        i -= 1
    return None


# ---------------------------------------------------------------------------------------------- masks


def _recovered_inside_literal(node: tree_sitter.Node, data: bytes) -> bool:
    """Whether a comment tree-sitter found inside an ERROR node, or right after one, is really inside a
    literal there (error recovery may leave a literal's opening quote in an ERROR node just before a comment
    it then lexes out of the literal's inside: ``x;}'<'"/* <MASK> */"``)."""
    error = node.parent
    while error is not None and error.type != "ERROR":
        error = error.parent
    if error is None and node.prev_sibling is not None and node.prev_sibling.type == "ERROR":
        error = node.prev_sibling
    return error is not None and lexed_inside_literal(data, error.start_byte, node.start_byte)


def _comments_containing(root: tree_sitter.Node, data: bytes, needle: bytes) -> list[tree_sitter.Node]:
    """Comment nodes whose text contains ``needle``, in file order, each once.

    Searching the bytes first and asking the tree which token covers each hit keeps a 5 MB file with a
    few masks cheap; the tree decides whether the hit is in a comment, a string or code.
    """
    hits: list[int] = []
    start = data.find(needle)
    while start != -1:
        hits.append(start)
        start = data.find(needle, start + len(needle))
    if len(hits) > _MANY_HITS:
        # Each descendant lookup scans siblings; with thousands of hits one pass over all comments is cheaper.
        comments = tree_sitter.QueryCursor(COMMENT_QUERY).captures(root).get("comment", [])
        return sorted(
            (c for c in comments if needle in data[c.start_byte : c.end_byte]), key=lambda c: c.start_byte
        )
    found: list[tree_sitter.Node] = []
    seen: set[int] = set()
    for start in hits:
        node = root.descendant_for_byte_range(start, start + len(needle))
        if node is not None and node.type == "comment" and node.start_byte not in seen:
            seen.add(node.start_byte)
            found.append(node)
    return found


def _mask_from_comment(
    node: tree_sitter.Node, data: bytes, index: int, positions: PositionIndex, functions: list[FunctionInfo]
) -> Mask | MalformedMask | None:
    start, end = node.start_byte, node.end_byte
    raw = data[start:end]
    if raw.startswith(b"//"):
        # tree-sitter's line comment swallows the CR of a CRLF; the mask must not, or a fill would eat it.
        while end > start and data[end - 1 : end] in (b"\r", b"\n"):
            end -= 1
    text = data[start:end].decode("utf-8", "replace")
    match = _MASK_COMMENT.fullmatch(text)
    reason = _malformed_reason(text) if match is None else None
    if match is None and reason is None:
        return None
    if match is None:
        return MalformedMask(start, end, positions.range_of(start, end), text, reason or "")
    digits = match.group(1) or match.group(2)
    budget = int(digits) if digits is not None else None
    if budget is not None and budget <= 0:
        reason = f"a budget must be a positive integer, got {budget}"
        return MalformedMask(start, end, positions.range_of(start, end), text, reason)
    func = _innermost(functions, start)
    return Mask(
        index=index,
        start_byte=start,
        end_byte=end,
        range=positions.range_of(start, end),
        budget=budget,
        function=func.name if func else None,
        kind=func.kind if func else None,
        signature=func.signature if func else None,
        function_start_byte=func.start_byte if func else None,
        function_end_byte=func.end_byte if func else None,
    )


def _malformed_reason(comment: str) -> str | None:
    """Why a comment that is not a mask was meant as one, or None when it was not meant as one."""
    inner = comment[2:-2] if comment.startswith("/*") and comment.endswith("*/") else comment[2:]
    inner = inner.strip()
    if not _MASK_ATTEMPT.match(inner):
        return None
    rest = inner[len("<MASK") :]
    if rest.startswith(">"):
        return "only blanks may follow the mask in its comment" if rest[1:].strip() else "unclosed comment"
    budget = _BUDGET.fullmatch(rest)
    if budget is None:
        return "expected <MASK> or <MASK:N>"
    value, closed, after = budget.group(1).strip(), budget.group(2), budget.group(3)
    if not closed:
        return "a mask must end with '>': <MASK> or <MASK:N>"
    if not _DIGITS.fullmatch(value) or int(value) <= 0:
        return f"a budget must be a positive integer, got {value or 'nothing'}"
    if after.strip():
        return "only blanks may follow the mask in its comment"
    return "expected <MASK> or <MASK:N>"


# ------------------------------------------------------------------------------------------- dice-spec


def _spec_from_comment(node: tree_sitter.Node, data: bytes, positions: PositionIndex) -> DiceSpec | None:
    text = node_text(data, node)
    if not text.startswith("/*"):
        return None
    inner = text[2:-2] if text.endswith("*/") and len(text) >= 4 else text[2:]
    header = _SPEC_HEADER.match(inner)
    if header is None:
        return None
    inner = inner[header.end() :].replace("\r\n", "\n").replace("\r", "\n")
    first_line, _, rest = inner.partition("\n")
    start_line = positions.line_of_byte(node.start_byte)
    if first_line.strip():
        source = first_line.strip() + "\n" + textwrap.dedent(rest)
        line_offset = start_line
    else:
        source = textwrap.dedent(rest)
        line_offset = start_line + 1
    source = source.rstrip() + "\n" if source.strip() else ""
    return DiceSpec(
        source=source,
        start_byte=node.start_byte,
        end_byte=node.end_byte,
        range=positions.range_of(node.start_byte, node.end_byte),
        line_offset=line_offset,
    )


# ------------------------------------------------------------------------------------------- functions


def _signature(data: bytes, start: int, end: int) -> str:
    return " ".join(data[start:end].decode("utf-8", "replace").split())


def _function_info(
    node: tree_sitter.Node,
    top: tree_sitter.Node,
    generic: bool,
    data: bytes,
    macros: dict[str, frozenset[str]],
) -> FunctionInfo | None:
    """``top`` is the outermost ``template_declaration`` around ``node``, or ``node`` itself; ``generic``
    says whether a template with parameters encloses it."""
    declarator = function_declarator(node.child_by_field_name("declarator"))
    if declarator is None:
        return None
    name_node = declarator.child_by_field_name("declarator")
    name = node_text(data, name_node) if name_node is not None else node_text(data, declarator)
    declarator_start = declarator.start_byte
    specifiers = []
    for child in node.children:
        if child.end_byte > declarator_start:
            break
        specifiers.append(child)
    body = node.child_by_field_name("body")
    body_start = body.start_byte if body is not None else node.end_byte
    end = node.end_byte
    # tree-sitter closes a body typed up to the end of the file with a MISSING "}"; the cursor after it
    # (blank lines included) is still in the body.
    unclosed = body is not None and body.child_count > 0 and body.children[-1].is_missing
    if unclosed and not data[end:].strip():
        end = len(data)
    return FunctionInfo(
        name=name,
        kind=kind_from_specifiers(specifiers, data, macros),
        signature=_signature(data, top.start_byte, body_start),
        start_byte=top.start_byte,
        end_byte=end,
        body_start_byte=body_start,
        body_end_byte=end if body is not None else node.end_byte,
        recovered=unclosed,
        is_template=generic,
    )


def _recover_functions(
    errors: list[tuple[tree_sitter.Node, bool]], data: bytes, macros: dict[str, frozenset[str]]
) -> list[FunctionInfo]:
    """Functions whose definition tree-sitter could not close, read from the children of ERROR nodes.

    While a body is being typed, tree-sitter often leaves ``__global__ void k(...) { ...`` as an ERROR node
    whose children are the specifiers, a function_declarator, a ``{`` token and the statements parsed so
    far. The body runs from that ``{`` to its matching ``}`` among the siblings, or to the ERROR's end.
    """
    recovered: list[FunctionInfo] = []
    for error, generic in errors:
        children = error.children
        for i, child in enumerate(children):
            if i + 1 >= len(children) or children[i + 1].type != "{":
                continue
            declarator = (
                child
                if child.type == "function_declarator"
                else (function_declarator(child) if child.type in DECLARATOR_WRAPPERS else None)
            )
            if declarator is None:
                continue
            j = i
            while j > 0 and children[j - 1].type in _DECL_SPECIFIER_TYPES:
                j -= 1
            specifiers = children[j:i]
            if not specifiers:
                continue  # a bare call such as `f(x) {` is not a definition
            depth, end = 0, None
            for sibling in children[i + 1 :]:
                if sibling.type == "{":
                    depth += 1
                elif sibling.type == "}":
                    depth -= 1
                    if depth == 0:
                        end = sibling.end_byte
                        break
            if end is None:
                # Unclosed: the body runs to the ERROR's end, or to the end of the file when only blanks
                # follow (the user is typing at the end of the file).
                end = len(data) if not data[error.end_byte :].strip() else error.end_byte
            name_node = declarator.child_by_field_name("declarator")
            body_start = children[i + 1].start_byte
            recovered.append(
                FunctionInfo(
                    name=node_text(data, name_node) if name_node is not None else node_text(data, declarator),
                    kind=kind_from_specifiers(specifiers, data, macros),
                    signature=_signature(data, specifiers[0].start_byte, body_start),
                    start_byte=specifiers[0].start_byte,
                    end_byte=end,
                    body_start_byte=body_start,
                    body_end_byte=end,
                    recovered=True,
                    is_template=generic or _after_template_header(children, j),
                )
            )
    return recovered


def _after_template_header(children: list[tree_sitter.Node], first_specifier: int) -> bool:
    """Whether ``template <params>`` precedes the specifiers at ``children[first_specifier]``."""
    i = first_specifier - 1
    while i >= 0 and children[i].type == "comment":
        i -= 1
    return i >= 1 and children[i].type == "template_parameter_list" and children[i].named_child_count > 0
