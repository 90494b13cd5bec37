"""The tree-sitter-cuda parser: one language object, one parser per thread (parsers are not thread-safe)."""

from __future__ import annotations

import threading

import tree_sitter
import tree_sitter_cuda

LANGUAGE = tree_sitter.Language(tree_sitter_cuda.language())
FUNCTION_QUERY = tree_sitter.Query(LANGUAGE, "(function_definition) @function")
ERROR_QUERY = tree_sitter.Query(LANGUAGE, "(ERROR) @error")
MACRO_QUERY = tree_sitter.Query(
    LANGUAGE, "(preproc_def name: (identifier) @name value: (preproc_arg) @value)")

_local = threading.local()


def parse_bytes(data: bytes) -> tree_sitter.Tree:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = tree_sitter.Parser(LANGUAGE)
    return parser.parse(data)


def function_nodes(root: tree_sitter.Node) -> list[tree_sitter.Node]:
    """Every ``function_definition`` under ``root`` (free functions, methods, templates), in file order."""
    captures = tree_sitter.QueryCursor(FUNCTION_QUERY).captures(root)
    nodes = captures.get("function", [])
    return sorted(nodes, key=lambda n: (n.start_byte, -n.end_byte))


def node_text(data: bytes, node: tree_sitter.Node) -> str:
    return data[node.start_byte : node.end_byte].decode("utf-8", "replace")
