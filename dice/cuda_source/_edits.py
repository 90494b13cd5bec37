"""Applying the extractor's edits: the identifiers the kept code uses, and the edited text with a map from
each of its lines to the original line."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

import tree_sitter

from dice.cuda_source._syntax import LANGUAGE, node_text
from dice.cuda_source.positions import _LINE_BREAK, PositionIndex, decode_bytes

Edit = tuple[int, int, bytes]  # (start, end, replacement) over the original bytes

_NAME_QUERY = tree_sitter.Query(
    LANGUAGE, "[(identifier) (type_identifier) (namespace_identifier) (primitive_type)] @name"
)
_MACRO_QUERY = tree_sitter.Query(
    LANGUAGE,
    """
[(preproc_def name: (identifier) @name value: (preproc_arg)? @body)
 (preproc_function_def name: (identifier) @name value: (preproc_arg)? @body)]""",
)
_DEFINITION_QUERY = tree_sitter.Query(
    LANGUAGE,
    """
[(type_definition declarator: (type_identifier) @name)
 (alias_declaration name: (type_identifier) @name)
 (preproc_def name: (identifier) @name)
 (preproc_function_def name: (identifier) @name)
 (struct_specifier name: (type_identifier) @name)
 (class_specifier name: (type_identifier) @name)
 (union_specifier name: (type_identifier) @name)
 (enum_specifier name: (type_identifier) @name)]""",
)
# Splits the raw text of a macro body (which tree-sitter does not parse) into identifier-like words.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _kept_test(edits: list[Edit]) -> Callable[[tree_sitter.Node], bool]:
    """Whether a node survives the drops among ``edits``."""
    dropped = sorted((start, end) for start, end, replacement in edits if end > start and not replacement)
    starts = [start for start, _ in dropped]

    def kept(node: tree_sitter.Node) -> bool:
        i = bisect.bisect_right(starts, node.start_byte) - 1
        return i < 0 or node.start_byte >= dropped[i][1]

    return kept


def names_defined(root: tree_sitter.Node, data: bytes, edits: list[Edit]) -> set[str]:
    """Type and macro names the code that survives ``edits`` defines (typedef, using, #define, tags)."""
    kept = _kept_test(edits)
    return {
        node_text(data, node)
        for node in tree_sitter.QueryCursor(_DEFINITION_QUERY).captures(root).get("name", [])
        if kept(node)
    }


def names_used(root: tree_sitter.Node, data: bytes, edits: list[Edit]) -> set[str]:
    """Identifier names used by the code that survives ``edits``, expanding the macros it uses.

    A macro body counts only when the macro is used: ``CUDA_CHECK`` bodies calling ``std::fprintf`` make
    nothing needed unless device code calls ``CUDA_CHECK``.
    """
    kept = _kept_test(edits)
    macros: dict[str, set[str]] = {}
    for _, captures in tree_sitter.QueryCursor(_MACRO_QUERY).matches(root):
        names, bodies = captures.get("name", []), captures.get("body", [])
        if names and kept(names[0]):
            words = macros.setdefault(node_text(data, names[0]), set())
            if bodies:
                words.update(_WORD.findall(node_text(data, bodies[0])))
    used: set[str] = set()
    for node in tree_sitter.QueryCursor(_NAME_QUERY).captures(root).get("name", []):
        parent = node.parent
        if parent is not None and parent.type in (
            "preproc_def",
            "preproc_function_def",
            "preproc_params",
            "preproc_ifdef",
            "preproc_defined",
        ):
            continue
        if kept(node):
            used.add(node_text(data, node))
    pending = [name for name in used if name in macros]
    while pending:
        for word in macros.pop(pending.pop(), ()):
            if word not in used:
                used.add(word)
                if word in macros:
                    pending.append(word)
    return used


def apply_edits(data: bytes, edits: list[Edit]) -> tuple[str, list[int]]:
    """Apply ``edits`` and split the result into lines, each tagged with the original line it comes from.

    A line that loses all its non-blank text to an edit disappears; untouched blank lines stay.
    """
    index = PositionIndex(data)
    lines: list[bytearray] = [bytearray()]
    origins: list[int] = [0]
    touched: list[bool] = [False]

    def add_original(start: int, end: int) -> None:
        cursor = start
        for match in _LINE_BREAK.finditer(data, start, end):
            lines[-1] += data[cursor : match.start()]
            lines.append(bytearray())
            origins.append(index.line_of_byte(match.end()))
            touched.append(False)
            cursor = match.end()
        lines[-1] += data[cursor:end]

    cursor = 0
    for start, end, replacement in edits:
        if start < cursor:
            continue  # overlaps an earlier edit (nested items): the outer edit wins
        add_original(cursor, start)
        touched[-1] = True
        if replacement:
            origin = index.line_of_byte(start)
            first, *rest = replacement.split(b"\n")
            lines[-1] += first
            for extra in rest:
                lines.append(bytearray(extra))
                origins.append(origin)
                touched.append(True)
        # Line breaks inside dropped code end lines that are dropped unless kept text shares them.
        for match in _LINE_BREAK.finditer(data, start, end):
            lines.append(bytearray())
            origins.append(index.line_of_byte(match.end()))
            touched.append(True)
        cursor = max(cursor, end)
    add_original(cursor, len(data))

    out_lines: list[str] = []
    line_map: list[int] = []
    for content, origin, was_touched in zip(lines, origins, touched, strict=True):
        if was_touched and not content.strip():
            continue
        text = decode_bytes(bytes(content))
        out_lines.append(text.rstrip() if was_touched else text)
        line_map.append(origin)
    while out_lines and not out_lines[-1].strip():
        out_lines.pop()
        line_map.pop()
    return "\n".join(out_lines) + ("\n" if out_lines else ""), line_map
