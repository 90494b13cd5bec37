"""The tree-sitter-cuda parser: one language object, one parser per thread (parsers are not thread-safe)."""

from __future__ import annotations

import threading

import tree_sitter
import tree_sitter_cuda

LANGUAGE = tree_sitter.Language(tree_sitter_cuda.language())
COMMENT_QUERY = tree_sitter.Query(LANGUAGE, "(comment) @comment")

_local = threading.local()


def parse_bytes(data: bytes) -> tree_sitter.Tree:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = tree_sitter.Parser(LANGUAGE)
    return parser.parse(data)


def node_text(data: bytes, node: tree_sitter.Node) -> str:
    return data[node.start_byte : node.end_byte].decode("utf-8", "replace")
