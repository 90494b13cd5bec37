"""Whether a CUDA file has syntax errors that the preprocessor does not explain.

tree-sitter parses the text before preprocessing, so valid code gets ERROR and MISSING nodes where macros
are not expanded: ``GGML_API void f();``, ``DEVICE_INLINE float g()``, ``const float * RESTRICT p``,
``__global__ void LAUNCH_BOUNDS(256) k()``, a statement macro with no ``;``, ``[=] DEVICE(int i) {...}``,
braces opened in both branches of an ``#if``, ``extern "C" {`` inside ``#ifdef __cplusplus``, string
literals holding ``/*`` in a ``#define``. The test: blank (with spaces, so every byte offset stays) what the
preprocessor would have rewritten, parse again, and see whether errors remain:

1. ``#define``/``#undef`` lines and conditional directives, the ``#else``/``#elif`` branches of conditionals
   (the first branch is kept, as ctags does; an ``#if 0`` body gives way to its ``#else``), and conditional
   blocks holding only ``extern "C" {`` or ``}``; ``#include`` lines stay;
2. at each remaining error (a few rounds), the macro-like word that explains it, with its parenthesised
   arguments: the word right before an error that a word follows (``MACRO type``, ``MACRO name``,
   ``MACRO(x) stmt``; ``x = BLOCK + ;`` stays an error), the word whose ``(...)`` ends there, macro calls
   inside an ERROR, a macro taken for a declaration's type or starting it, a macro call taken for a
   declarator (``INHERIT_PARAMS(21, 20)`` in a class body).

A word is macro-like when the file ``#define``s it, when it is ALL_CAPS, when it is a reserved ``__word__``
(``__attribute__``, ``__restrict__``), or ``va_arg``/``offsetof``. Blanking never removes a brace, so a
function left open while the user types stays an error. Measured on mutants of error-free real files
(a token deleted, repeated or the file cut): 12 of 995 syntax errors are explained away, all next to a
macro (a statement macro's ``;`` deleted, an ALL_CAPS constant repeated).
"""

from __future__ import annotations

import re

import tree_sitter

from dice.cuda_source._preprocessor import (
    Directive,
    brace_only_conditionals,
    define_names,
    group_end,
    scan_directives,
)
from dice.cuda_source._syntax import parse_bytes

_ROUNDS = 4
_MAX_ERRORS = 4000
_SMALL_ERROR = 400
_WORD = re.compile(rb"[A-Za-z_]\w*\Z")
_CAPS = re.compile(r"[A-Z][A-Z0-9_]+\Z")
_WORD_LEAVES = frozenset(
    {"identifier", "type_identifier", "field_identifier", "namespace_identifier", "statement_identifier"}
)
_RESERVED_KEYWORDS = frozenset({"__attribute__", "__declspec", "__launch_bounds__", "alignas", "__align__"})
_TYPE_LEAVES = frozenset(
    {"primitive_type", "struct", "class", "union", "enum", "const", "volatile", "unsigned"}
)
_CALL_LIKE = frozenset({"init_declarator", "call_expression", "function_declarator", "declaration"})
_KNOWN_MACROS = frozenset({"va_arg", "va_start", "va_end", "va_copy", "offsetof"})
_ITEMS = frozenset(
    {
        "declaration",
        "field_declaration",
        "function_definition",
        "parameter_declaration",
        "alias_declaration",
        "type_definition",
        "expression_statement",
    }
)
# Every byte becomes a space except line breaks, so lines and byte offsets stay where they were.
_BLANKING = bytes(b if b in (0x0A, 0x0D) else 0x20 for b in range(256))
_CONDITIONALS = frozenset({"if", "ifdef", "ifndef"})
# Directives that are blanked: macro definitions and conditionals (an `#include` line stays, and is checked).
_CONSUMED = frozenset(
    {"define", "undef", "if", "ifdef", "ifndef", "elif", "else", "elifdef", "elifndef", "endif"}
)
_BRANCHES = frozenset({"elif", "else", "elifdef", "elifndef"})
_IF_ZERO = re.compile(rb"#[ \t]*if[ \t]+0[ \t]*(?:/[/*].*)?\Z", re.S)


def has_unexplained_errors(data: bytes, root: tree_sitter.Node) -> bool:
    """Whether ``root`` (the tree of ``data``) has an ERROR or MISSING node no unexpanded macro explains."""
    if not root.has_error:
        return False
    directives = scan_directives(data)
    macros = define_names(data, directives)
    blank = bytearray(data)
    for start, end in _directive_blanks(data, directives):
        _blank(blank, start, end)
    text = bytes(blank)
    tree_root = parse_bytes(text).root_node
    for _ in range(_ROUNDS):
        errors = _error_nodes(tree_root)
        if not errors:
            return False
        spans = [(s, e) for s, e in _explaining_macros(errors, text, macros) if text[s:e].strip()]
        if not spans:
            return True
        for start, end in spans:
            _blank(blank, start, end)
        text = bytes(blank)
        tree_root = parse_bytes(text).root_node
    return bool(_error_nodes(tree_root))


def _blank(buffer: bytearray, start: int, end: int) -> None:
    buffer[start:end] = bytes(buffer[start:end]).translate(_BLANKING)


def _directive_blanks(data: bytes, directives: list[Directive]) -> list[tuple[int, int]]:
    blanks = brace_only_conditionals(data, directives)
    stack: list[list[int | bool | None]] = []  # per open conditional: [a branch was taken, blank from]
    for directive in directives:
        keyword = directive.keyword
        if keyword in _CONSUMED:
            blanks.append((directive.start, directive.end))
        if keyword in _CONDITIONALS:
            if_zero = bool(_IF_ZERO.match(data[directive.start : directive.end].strip()))
            stack.append([not if_zero, directive.end if if_zero else None])
        elif keyword in _BRANCHES and stack:
            top = stack[-1]
            if top[1] is None:
                top[1] = directive.start  # the first branch was kept: this one and the rest go
            elif not top[0]:
                blanks.append((int(top[1]), directive.start))  # the end of an `#if 0` body
                top[0], top[1] = True, None
        elif keyword == "endif" and stack:
            _taken, start = stack.pop()
            if start is not None:
                blanks.append((int(start), directive.start))
    return blanks


def _error_nodes(root: tree_sitter.Node) -> list[tree_sitter.Node]:
    found: list[tree_sitter.Node] = []
    stack = [root]
    while stack and len(found) < _MAX_ERRORS:
        node = stack.pop()
        if node.is_missing:
            if not _grammar_gap(node):
                found.append(node)
            continue
        if node.type == "ERROR":
            found.append(node)
        if node.has_error:
            stack.extend(node.children)
    return found


def _grammar_gap(node: tree_sitter.Node) -> bool:
    """MISSING nodes tree-sitter-cuda adds to valid code: ``template struct S<float>;`` lacks a declarator."""
    parent = node.parent
    if parent is None:
        return False
    # `void f(std::initializer_list<int> v = {})`: the default `{}` becomes a compound literal with no type.
    return (node.type == "identifier" and parent.type == "template_instantiation") or (
        node.type == "type_identifier" and parent.type == "compound_literal_expression"
    )


def _macro_like(word: str, macros: set[str]) -> bool:
    return (
        word in macros
        or bool(_CAPS.match(word))
        or (word.startswith("__") and word.endswith("__") and len(word) > 4)
        or word in _RESERVED_KEYWORDS
        or word in _KNOWN_MACROS
    )


def _is_word(node: tree_sitter.Node | None, text: bytes) -> bool:
    return node is not None and bool(_WORD.match(text[node.start_byte : node.end_byte]))


def _macro_word(node: tree_sitter.Node | None, text: bytes, macros: set[str]) -> bool:
    if node is None or (node.type not in _WORD_LEAVES and node.type not in _RESERVED_KEYWORDS):
        return False
    return _macro_like(text[node.start_byte : node.end_byte].decode("utf-8", "replace"), macros)


def _explaining_macros(
    errors: list[tree_sitter.Node], text: bytes, macros: set[str]
) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for error in errors:
        before = _prev_leaf(error)
        explained_by_before = _span_before(error, before, text, macros)
        if explained_by_before is not None:
            spans.append(explained_by_before)
        elif error.type == "ERROR":
            spans += _inside(error, text, macros)
        spans += _declarator_macro(error, text, macros)
        item = _enclosing_item(error)
        if item is None:
            continue
        taken_for_type = item.child_by_field_name("type")
        if taken_for_type is not None and _macro_word(taken_for_type, text, macros):
            spans.append(_macro_use(text, taken_for_type))  # `HD iterator_t(int i) : index(i) {}`
        first = _first_leaf(item)
        if (
            item.type != "expression_statement"
            and (_is_word(before, text) or _text(before, text) == b">")
            and first is not before
            and _macro_word(first, text, macros)
        ):
            spans.append(_macro_use(text, first))  # `LOCALS\n const int n = ...`
    return spans


def _span_before(
    error: tree_sitter.Node, before: tree_sitter.Node | None, text: bytes, macros: set[str]
) -> tuple[int, int] | None:
    """The macro right before an error that a word follows (``API void f``, ``RESTRICT p``, ``LB(256) k``,
    ``CHECK(x) y = 1``), or before a missing ``;`` (a statement macro such as ``END_NAMESPACE``)."""
    after = _next_leaf(error) if error.is_missing or not error.child_count else _first_leaf(error)
    if not _is_word(after, text) and not (error.is_missing and error.type == ";"):
        return None
    if _macro_word(before, text, macros):
        return _macro_use(text, before)
    if _text(before, text) == b")":
        opening = _matching_open(text, before.start_byte)
        word = _word_ending_at(text, opening) if opening is not None else None
        if word is not None and _macro_like(text[word:opening].decode("utf-8", "replace").strip(), macros):
            return word, before.end_byte
    return None


def _inside(error: tree_sitter.Node, text: bytes, macros: set[str]) -> list[tuple[int, int]]:
    """Macros within an ERROR: ``NORETURN FORMAT(3, 4) API`` before a declaration, ``DEVICE`` right after
    a lambda capture ``[=]`` that is the ERROR, ``va_arg(ap, char *)``; in a large ERROR only macro calls
    that start their line (``SHFL_OP(up, f32)`` repeated with no ``;``)."""
    if error.end_byte - error.start_byte > _SMALL_ERROR:
        return [
            _macro_use(text, word) for word in _line_starts(error, text) if _macro_word(word, text, macros)
        ]
    spans = []
    for child in error.children:
        word = _first_leaf(child) if child.type in _CALL_LIKE else child
        if _macro_word(word, text, macros):
            spans.append(_macro_use(text, word))
    following = _next_leaf(error)
    if _text(_last_leaf(error), text) == b"]" and _macro_word(following, text, macros):
        spans.append(_macro_use(text, following))  # a lambda's capture, then `DEVICE(int i)`
    if any(leaf.type in _TYPE_LEAVES for leaf in _leaves(error)):
        spans += _macro_arguments(error, text, macros)
    return spans


def _line_starts(error: tree_sitter.Node, text: bytes) -> list[tree_sitter.Node]:
    """Children of a large ERROR that start their line and are followed by ``(``: declaration macros
    such as ``SHFL_OP_MACRO(up, true, f32)`` repeated at namespace scope with no ``;``."""
    found = []
    for child in error.children:
        word = _first_leaf(child)
        line_start = max(text.rfind(b"\n", 0, word.start_byte), text.rfind(b"\r", 0, word.start_byte)) + 1
        if text[word.end_byte : word.end_byte + 256].lstrip()[:1] == b"(" and not text[
            line_start : word.start_byte
        ].strip(b" \t"):
            found.append(word)
    return found


def _macro_arguments(error: tree_sitter.Node, text: bytes, macros: set[str]) -> list[tuple[int, int]]:
    """The inside of the parentheses of a macro call whose arguments hold a type (``va_arg(ap, char *)``)."""
    parent = error.parent
    if parent is None or parent.type != "argument_list" or parent.parent is None:
        return []
    function = parent.parent.child_by_field_name("function")
    if function is None or not _macro_word(function, text, macros):
        return []
    return [(parent.start_byte + 1, parent.end_byte - 1)]


def _declarator_macro(error: tree_sitter.Node, text: bytes, macros: set[str]) -> list[tuple[int, int]]:
    """A macro call taken for a declarator: ``INHERIT_PARAMS(21, 20)`` in a class body parses as a
    parameter list or a parenthesised declarator holding the error."""
    parent = error.parent
    if parent is None or parent.type not in ("parameter_list", "parenthesized_declarator"):
        return []
    word = _prev_leaf(parent)
    return [_with_arguments(text, word.start_byte, word.end_byte)] if _macro_word(word, text, macros) else []


def _enclosing_item(node: tree_sitter.Node) -> tree_sitter.Node | None:
    parent = node.parent
    while parent is not None:
        if parent.type in _ITEMS:
            return parent
        if parent.type in ("compound_statement", "field_declaration_list", "declaration_list"):
            return None
        parent = parent.parent
    return None


def _macro_use(text: bytes, word: tree_sitter.Node) -> tuple[int, int]:
    """The bytes of a macro word with the ``(...)`` that follows it, except after a lambda's ``]``
    (``[=] MGPU_DEVICE(int i) {...}``: the parentheses are the lambda's)."""
    before = _prev_leaf(word)
    if before is not None and text[before.start_byte : before.end_byte] == b"]":
        return word.start_byte, word.end_byte
    return _with_arguments(text, word.start_byte, word.end_byte)


def _with_arguments(text: bytes, start: int, end: int) -> tuple[int, int]:
    """``(start, end)`` of a macro word, extended over a ``(...)`` that follows it."""
    i = end
    while i < len(text) and text[i] in b" \t\r\n":
        i += 1
    group = group_end(text, i) if text[i : i + 1] == b"(" else None
    return (start, group) if group is not None else (start, end)


def _matching_open(text: bytes, close: int) -> int | None:
    depth = 0
    i = close
    while i >= 0 and close - i < 4096:
        ch = text[i : i + 1]
        if ch in (b";", b"{", b"}", b'"'):
            return None
        if ch == b")":
            depth += 1
        elif ch == b"(":
            depth -= 1
            if depth == 0:
                return i
        i -= 1
    return None


def _word_ending_at(text: bytes, i: int) -> int | None:
    j = i
    while j > 0 and text[j - 1] in b" \t":
        j -= 1
    k = j
    while k > 0 and (chr(text[k - 1]).isalnum() or text[k - 1] == 0x5F):
        k -= 1
    return k if k < j else None


def _leaves(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    leaves: list[tree_sitter.Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.child_count == 0:
            leaves.append(current)
        else:
            stack.extend(reversed(current.children))
    return leaves


def _first_leaf(node: tree_sitter.Node) -> tree_sitter.Node:
    while node.child_count:
        node = node.children[0]
    return node


def _last_leaf(node: tree_sitter.Node) -> tree_sitter.Node:
    while node.child_count:
        node = node.children[-1]
    return node


def _real(node: tree_sitter.Node) -> bool:
    return node.type != "comment" and not node.is_missing and node.end_byte > node.start_byte


def _prev_leaf(node: tree_sitter.Node) -> tree_sitter.Node | None:
    current: tree_sitter.Node | None = node
    while True:
        while current is not None and current.prev_sibling is None:
            current = current.parent
        if current is None:
            return None
        current = current.prev_sibling
        while current.child_count:
            current = current.children[-1]
        if _real(current):
            return current


def _next_leaf(node: tree_sitter.Node) -> tree_sitter.Node | None:
    current: tree_sitter.Node | None = node
    while True:
        while current is not None and current.next_sibling is None:
            current = current.parent
        if current is None:
            return None
        current = current.next_sibling
        while current.child_count:
            current = current.children[0]
        if _real(current):
            return current


def _text(node: tree_sitter.Node | None, text: bytes) -> bytes:
    return b"" if node is None else text[node.start_byte : node.end_byte]
