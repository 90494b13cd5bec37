"""tree-sitter-cuda plumbing shared by the document and device-code modules: the parser (one per thread:
parsers are not thread-safe), the walk over definition scopes, and reading execution spaces."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

import tree_sitter
import tree_sitter_cuda

FunctionKind = Literal["global", "device", "host"]

LANGUAGE = tree_sitter.Language(tree_sitter_cuda.language())
COMMENT_QUERY = tree_sitter.Query(LANGUAGE, "(comment) @comment")

EXECUTION_SPACES = {"__global__", "__device__", "__host__"}
# Words that may make up a qualifier macro such as ``#define HD __host__ __device__ __forceinline__``.
_QUALIFIER_WORDS = EXECUTION_SPACES | {
    "__forceinline__",
    "__noinline__",
    "__inline__",
    "inline",
    "static",
    "extern",
    "constexpr",
}
# Nodes whose children may be definitions: namespace and class scopes, linkage and #if blocks, and ERROR
# nodes (a half-typed definition leaves its pieces, and often the definitions after it, inside one).
_SCOPE_TYPES = frozenset(
    {
        "translation_unit",
        "declaration_list",
        "namespace_definition",
        "linkage_specification",
        "preproc_if",
        "preproc_ifdef",
        "preproc_else",
        "preproc_elif",
        "preproc_elifdef",
        "ERROR",
        "class_specifier",
        "struct_specifier",
        "union_specifier",
        "field_declaration_list",
        "declaration",
        "field_declaration",
    }
)
DECLARATOR_WRAPPERS = {
    "pointer_declarator",
    "reference_declarator",
    "attributed_declarator",
    "parenthesized_declarator",
}

_local = threading.local()


def parse_bytes(data: bytes) -> tree_sitter.Tree:
    """The tree-sitter-cuda syntax tree of UTF-8 source bytes (one parser per thread): every parse of CUDA
    text in the project goes through here."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = tree_sitter.Parser(LANGUAGE)
    return parser.parse(data)


def node_text(data: bytes, node: tree_sitter.Node) -> str:
    return data[node.start_byte : node.end_byte].decode("utf-8", "replace")


@dataclass
class Scopes:
    """``functions``: (definition, outermost template_declaration around it or the definition itself,
    generic); ``errors``: (ERROR node, generic). ``generic``: inside a template with parameters (a function
    template, or a class template's body), so the code is compiled only when instantiated."""

    functions: list[tuple[tree_sitter.Node, tree_sitter.Node, bool]] = field(default_factory=list)
    errors: list[tuple[tree_sitter.Node, bool]] = field(default_factory=list)
    macros: list[tree_sitter.Node] = field(default_factory=list)  # preproc_def nodes


def has_template_parameters(template: tree_sitter.Node) -> bool:
    """``template <typename T>`` has parameters; an explicit specialisation's ``template <>`` has none."""
    parameters = template.child_by_field_name("parameters")
    return parameters is not None and parameters.named_child_count > 0


def scan_scopes(root: tree_sitter.Node) -> Scopes:
    """Function definitions, ERROR nodes and ``#define``s at namespace or class scope.

    Walking only the scopes that can hold definitions (never statement bodies) costs one visit per
    top-level item, and stays fast on pathological nesting where tree-sitter queries go quadratic.
    """
    found = Scopes()
    stack: list[tuple[tree_sitter.Node, tree_sitter.Node | None, bool]] = [(root, None, False)]
    while stack:
        node, template, generic = stack.pop()
        if node.type == "ERROR":
            found.errors.append((node, generic))
        for child in node.children:
            kind = child.type
            if kind == "function_definition":
                found.functions.append((child, template or child, generic))
            elif kind == "template_declaration":
                stack.append((child, template or child, generic or has_template_parameters(child)))
            elif kind == "preproc_def":
                found.macros.append(child)
            elif kind in _SCOPE_TYPES:
                stack.append((child, None, generic))
    return found


def qualifier_macros(defines: list[tree_sitter.Node], data: bytes) -> dict[str, frozenset[str]]:
    """Object-like macros that expand only to qualifiers, e.g. ``#define HD __host__ __device__``."""
    macros: dict[str, frozenset[str]] = {}
    for define in defines:
        name, value = define.child_by_field_name("name"), define.child_by_field_name("value")
        if name is None or value is None:
            continue
        words = node_text(data, value).split()
        if (
            words
            and all(w in _QUALIFIER_WORDS or w.startswith("__launch_bounds__") for w in words)
            and EXECUTION_SPACES.intersection(words)
        ):
            macros[node_text(data, name)] = frozenset(words)
    return macros


def kind_from_specifiers(
    specifiers: list[tree_sitter.Node], data: bytes, macros: dict[str, frozenset[str]]
) -> FunctionKind:
    spaces: set[str] = set()
    for node in specifiers:
        if node.type in EXECUTION_SPACES:
            spaces.add(node.type)
        elif node.type in ("type_identifier", "identifier") and node.end_byte - node.start_byte < 64:
            spaces |= macros.get(node_text(data, node), frozenset()) & EXECUTION_SPACES
    if "__global__" in spaces:
        return "global"
    # __host__ __device__ functions are device code too (they compile for, and run on, the GPU).
    if "__device__" in spaces:
        return "device"
    return "host"


def function_declarator(node: tree_sitter.Node | None) -> tree_sitter.Node | None:
    """Follow ``declarator`` fields (through pointer/reference wrappers) to the function_declarator."""
    depth = 0
    while node is not None and depth < 32:
        if node.type == "function_declarator":
            return node
        if node.type not in DECLARATOR_WRAPPERS and node.type != "function_definition":
            return None
        nxt = node.child_by_field_name("declarator")
        if nxt is None:
            nxt = next(
                (
                    c
                    for c in node.named_children
                    if c.type in DECLARATOR_WRAPPERS or c.type == "function_declarator"
                ),
                None,
            )
        node = nxt
        depth += 1
    return None
