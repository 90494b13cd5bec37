"""CUDA source strings inside python programs, and the infill holes cut from them.

The holes are what the editor asks the model to fill: a statement, a run of a few statements, a loop body, a
whole kernel body. The CUDA is parsed with the project's tree-sitter-cuda parser (``dice.cuda_source``).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

INFILL_KINDS = ("statement", "statements", "loop_body", "kernel_body")
STATEMENT_TYPES = frozenset(
    {
        "declaration",
        "expression_statement",
        "return_statement",
        "if_statement",
        "for_statement",
        "while_statement",
        "do_statement",
        "break_statement",
        "continue_statement",
    }
)


@dataclass(frozen=True)
class CudaString:
    """A CUDA source string inside a python program: ``program[start:end] == text``."""

    text: str
    start: int
    end: int


def cuda_strings(program: str) -> list[CudaString]:
    """String constants of ``program`` that hold device code (``__global__``), with their character span."""
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return []
    line_starts = [0]
    for line in program.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    out = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value
        ):
            continue
        if node.end_lineno is None or node.end_col_offset is None:
            continue

        # ast column offsets are UTF-8 byte offsets within the line.
        def offset(lineno: int, col: int) -> int:
            line = program[line_starts[lineno - 1] : line_starts[lineno]]
            return line_starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))

        start, end = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        literal = program[start:end]
        inner = literal.find(node.value[:40]) if node.value else -1
        if inner < 0 or program[start + inner : start + inner + len(node.value)] != node.value:
            continue  # escapes or implicit concatenation: the text is not verbatim in the program
        out.append(CudaString(node.value, start + inner, start + inner + len(node.value)))
    out.sort(key=lambda s: s.start)
    return out


@dataclass(frozen=True)
class InfillCut:
    """``text[:start]`` + ``text[end:]`` around a hidden middle ``text[start:end]`` (character offsets)."""

    kind: str
    start: int
    end: int


def _device_functions(root) -> Iterator:
    """(definition, body) of the top-level ``__global__`` and ``__device__`` function definitions."""
    for node in root.children:
        if node.type != "function_definition":
            continue
        qualifiers = {c.type for c in node.children}
        if "__global__" in qualifiers or "__device__" in qualifiers:
            body = node.child_by_field_name("body")
            if body is not None:
                yield node, body


def inner_span(src: bytes, body) -> tuple[int, int] | None:
    """Byte span of a compound statement's content, without the braces and surrounding whitespace."""
    inner = src[body.start_byte + 1 : body.end_byte - 1]
    stripped = inner.strip()
    if not stripped:
        return None
    lead = len(inner) - len(inner.lstrip())
    return body.start_byte + 1 + lead, body.start_byte + 1 + lead + len(stripped)


def infill_cuts(text: str) -> list[InfillCut]:
    """Every candidate hole of a CUDA source: statements, runs of 2-4 statements, loop bodies, device
    function bodies. Offsets are character offsets into ``text``."""
    # Imported here: tree-sitter is not needed to train (the device image lacks it).
    from dice.cuda_source import parse_bytes

    src = text.encode("utf-8")
    tree = parse_bytes(src)
    byte_cuts: list[tuple[str, int, int]] = []
    for fn, body in _device_functions(tree.root_node):
        span = inner_span(src, body)
        if span and "__global__" in {c.type for c in fn.children}:
            byte_cuts.append(("kernel_body", *span))
        byte_cuts += block_cuts(src, body)
    # bytes -> characters
    char_of = _byte_to_char_map(text)
    return [InfillCut(k, char_of[a], char_of[b]) for k, a, b in byte_cuts]


def block_cuts(src: bytes, body) -> list[tuple[str, int, int]]:  # body: tree_sitter.Node
    """The holes inside one compound statement (a function body) and the blocks nested in it, as
    ``(kind, start byte, end byte)``: one-line statements, runs of 2-4 statements, loop bodies."""
    byte_cuts: list[tuple[str, int, int]] = []
    stack = [body]
    while stack:
        block = stack.pop()
        stmts = [c for c in block.named_children if c.type in STATEMENT_TYPES and not c.has_error]
        for s in stmts:
            if b"\n" not in src[s.start_byte : s.end_byte] and s.end_byte - s.start_byte >= 6:
                byte_cuts.append(("statement", s.start_byte, s.end_byte))
        for i in range(len(stmts) - 1):
            j = min(len(stmts), i + 2 + (s_hash(stmts[i].start_byte) % 3))
            byte_cuts.append(("statements", stmts[i].start_byte, stmts[j - 1].end_byte))
        for s in block.named_children:
            for sub in s.named_children:
                if sub.type == "compound_statement":
                    stack.append(sub)
                    if s.type in ("for_statement", "while_statement"):
                        span = inner_span(src, sub)
                        if span:
                            byte_cuts.append(("loop_body", *span))
    return byte_cuts


def s_hash(value: int) -> int:
    return int(hashlib.blake2b(str(value).encode(), digest_size=4).hexdigest(), 16)


def _byte_to_char_map(text: str) -> list[int]:
    out = []
    for i, ch in enumerate(text):
        out.extend([i] * len(ch.encode("utf-8")))
    out.append(len(text))
    return out
