"""Infill examples cut from real CUDA files, rendered and windowed exactly as the editor prompts at inference.

Holes are cut with tree-sitter (``dice.cuda_source``) in every function body of a file: kernels, device and
host functions, templates included (training text need not compile). Kinds and their default mix
(:data:`KIND_WEIGHTS`): a one-line statement, an expression (``training.cuke.cu_tasks.expression_spans``: the
value of an initialisation or assignment, a condition, an index, a return value), a run of 2-4 statements, a
loop body, a kernel / device function body (``training.corpus.cuts.block_cuts``).

A statement-like hole alone on its line(s) is cut at whole lines, as the assistant's ``"infill_holes":
"line"`` mode cuts a mask (``dice.cuda_source.line_aligned_span``): the prefix ends at the start of the hole's
first line, the middle is whole lines (indentation and final line break included), the suffix starts at the
next line. Expressions (and statements sharing a line with other code) keep the byte cut.

The text around the hole is trimmed as the assistant trims it (``dice.cuda_source.trim_context``: the
enclosing function kept whole when it fits, cuts at line boundaries, two thirds of the spare budget before
the hole), to a budget in bytes of ``2 * len(prefix) + len(suffix)`` drawn per example from
``HoleConfig.window``, so the model sees short and long contexts.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from training.corpus.examples import Example
from training.cuke.records import CuFile

KIND_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("statement", 0.45),
    ("expression", 0.20),
    ("statements", 0.15),
    ("loop_body", 0.10),
    ("kernel_body", 0.10),
)
HOLE_KINDS = tuple(k for k, _ in KIND_WEIGHTS)
LINE_KINDS = frozenset({"statement", "statements", "loop_body", "kernel_body"})
DEFAULT_WINDOW = (1500, 6000)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


@dataclass(frozen=True)
class HoleConfig:
    """How many holes a file gets (``holes_per_kb`` per 1,000 bytes, at least 1, at most ``max_holes``),
    which kinds, how long a middle may be and the window budget range (bytes, inclusive)."""

    seed: int = 0
    holes_per_kb: float = 1 / 1.5
    max_holes: int = 24
    window: tuple[int, int] = DEFAULT_WINDOW
    max_middle_chars: int = 1600
    weights: tuple[tuple[str, float], ...] = KIND_WEIGHTS
    prefix_weight: int = 2  # DICE's infilling format shows the prefix twice

    def validate(self) -> None:
        lo, hi = self.window
        if not 0 < lo <= hi:
            raise ValueError(f"the window must be MIN,MAX bytes with 0 < MIN <= MAX, got {lo},{hi}")
        if self.holes_per_kb <= 0 or self.max_holes < 1:
            raise ValueError("holes per KB must be > 0 and the holes per file >= 1")
        unknown = {k for k, _ in self.weights} - set(HOLE_KINDS)
        if unknown or not any(w > 0 for _, w in self.weights):
            raise ValueError(f"hole kinds are {', '.join(HOLE_KINDS)} with a positive weight")

    def holes_for(self, size: int) -> int:
        return max(1, min(self.max_holes, round(size / 1000 * self.holes_per_kb)))


@dataclass(frozen=True)
class Hole:
    """``data[start:end]`` is the middle (UTF-8 byte offsets, whole lines when ``line_aligned``);
    ``fn_start:fn_end`` the enclosing function, kept whole in the window when it fits."""

    kind: str
    start: int
    end: int
    fn_start: int
    fn_end: int
    line_aligned: bool


@dataclass
class FileExamples:
    """What one file gave: its examples, or why none (``skipped``), and counts of holes not made."""

    examples: list[Example] = field(default_factory=list)
    skipped: str | None = None  # "not_utf8" | "no_function_body" | "no_hole"
    empty_prefix: int = 0


def candidate_holes(data: bytes, max_middle_chars: int) -> list[Hole] | None:
    """Every usable hole of a file, each span once (the first kind that cuts it); None when the file has
    no function body. A middle that is blank or only comments, or longer than ``max_middle_chars``
    characters, is not a hole."""
    from dice.cuda_source import line_aligned_span, parse_bytes, parse_document
    from training.corpus.cuts import block_cuts, inner_span
    from training.cuke.cu_tasks import expression_spans

    doc = parse_document(data.decode("utf-8"))
    root = parse_bytes(data).root_node
    bodies = 0
    holes: list[Hole] = []
    seen: set[tuple[int, int]] = set()
    for fn in doc.functions:
        if fn.recovered:
            continue
        body = root.descendant_for_byte_range(fn.body_start_byte, fn.body_end_byte)
        if body is None or body.type != "compound_statement" or body.start_byte != fn.body_start_byte:
            continue
        bodies += 1
        cuts = block_cuts(data, body)
        span = inner_span(data, body)
        if span and fn.kind in ("global", "device"):
            cuts.append(("kernel_body", *span))
        cuts += [("expression", a, b) for a, b in expression_spans(data, [body])]
        for kind, start, end in cuts:
            aligned = line_aligned_span(data, start, end) if kind in LINE_KINDS else None
            if aligned is not None:
                start, end = aligned
            if (start, end) in seen or not _usable(data[start:end], max_middle_chars):
                continue
            seen.add((start, end))
            fstart, fend = min(fn.start_byte, start), max(fn.end_byte, end)
            holes.append(Hole(kind, start, end, fstart, fend, aligned is not None))
    return holes if bodies else None


def _usable(middle: bytes, max_chars: int) -> bool:
    text = middle.decode("utf-8", "replace")
    return len(text) <= max_chars and bool(_COMMENTS.sub("", text).strip())


def pick_holes(
    holes: Sequence[Hole], n: int, rng: random.Random, weights: Sequence[tuple[str, float]]
) -> list[Hole]:
    """Up to ``n`` distinct holes: each draw picks a kind by ``weights`` among the kinds with holes left,
    then a hole of that kind at random."""
    pools: dict[str, list[Hole]] = {}
    for hole in holes:
        pools.setdefault(hole.kind, []).append(hole)
    for kind in sorted(pools):
        rng.shuffle(pools[kind])
    weight = {k: w for k, w in weights if w > 0}
    out: list[Hole] = []
    while len(out) < n:
        kinds = [k for k in weight if pools.get(k)]
        if not kinds:
            break
        kind = rng.choices(kinds, weights=[weight[k] for k in kinds])[0]
        out.append(pools[kind].pop())
    return out


def window(data: bytes, hole: Hole, budget: int, prefix_weight: int = 2) -> tuple[str, str, str]:
    """(prefix, middle, suffix) of ``hole``, the text around it trimmed as the assistant trims a prompt's
    (``dice.cuda_source.hole_context``: the enclosing function kept whole when it fits), so that
    ``prefix_weight * len(prefix) + len(suffix) <= budget`` in UTF-8 bytes."""
    from dice.cuda_source import hole_context
    from dice.cuda_source.positions import decode_bytes

    span = (hole.fn_start, hole.fn_end)
    before, after = hole_context(data, hole.start, hole.end, span, budget, prefix_weight)
    return decode_bytes(before), decode_bytes(data[hole.start : hole.end]), decode_bytes(after)


def file_examples(item: tuple[CuFile, str], cfg: HoleConfig) -> FileExamples:
    """The examples of one file (``item``: the file and its split, "train" or "heldout"), seeded by
    ``cfg.seed`` and the file's id: the same file gives the same examples in any order, in any process."""
    from training.corpus.render import render_cu_infill

    f, _split = item
    try:
        data = f.text.encode("utf-8")
    except UnicodeEncodeError:
        return FileExamples(skipped="not_utf8")
    holes = candidate_holes(data, cfg.max_middle_chars)
    if holes is None:
        return FileExamples(skipped="no_function_body")
    rng = random.Random(f"{cfg.seed}:{f.id}")
    picked = pick_holes(holes, cfg.holes_for(len(data)), rng, cfg.weights)
    out = FileExamples(skipped=None if picked else "no_hole")
    file_key = hashlib.sha256(f.id.encode()).hexdigest()[:12]
    for n, hole in enumerate(picked):
        budget = rng.randint(*cfg.window)
        prefix, middle, suffix = window(data, hole, budget, cfg.prefix_weight)
        if not prefix.strip():
            out.empty_prefix += 1  # nothing before the hole survived the budget: no context to learn from
            continue
        prompt, response = render_cu_infill(prefix, middle, suffix)
        meta = {
            "kind": hole.kind,
            "prefix": prefix,
            "middle": middle,
            "suffix": suffix,
            "repo": f.repo,
            "path": f.path,
            "license": f.license,
            "line_aligned": hole.line_aligned,
            "budget": budget,
        }
        out.examples.append(
            Example(
                f"cc-{file_key}-{n}", f.id, "cu_infill", f"cuda-corpus:{hole.kind}", prompt, response, meta
            )
        )
    return out


__all__ = [
    "DEFAULT_WINDOW",
    "HOLE_KINDS",
    "KIND_WEIGHTS",
    "LINE_KINDS",
    "FileExamples",
    "Hole",
    "HoleConfig",
    "candidate_holes",
    "file_examples",
    "pick_holes",
    "window",
]
