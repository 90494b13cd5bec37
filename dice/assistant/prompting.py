"""From a document and a hole in it to the engine's infilling request (prefix, suffix, reference context).

The engine renders the DICE template; this module only decides what text goes into it: the file around
the hole (the enclosing kernel always, then as much of the rest of the file as fits the model's context),
with the other masks left as holes, and the file's ``dice-spec`` reference as separate context.

Where the hole is cut is a property of the model (``infill_holes`` in a ``dice.json`` beside its weights):
"byte" (default) cuts at the mask comment's own bytes, the shape dice-tiny's ``.cu`` holes were trained on
(``training.corpus.infill_cuts``: a statement's bytes, so the prefix ends with the line's indentation); "line"
moves the cut of a mask alone on its line(s) to whole lines, and ``InfillRequest.mask_fill`` maps the
generated lines back onto the comment's range.

The byte windowing (whole-line holes, trimming the file to the budget around the enclosing function) is
``dice.cuda_source.window``'s, shared with the embedded model's training corpus (``training.embedded``), so
the model is trained on the windows it is prompted with.

Where a fill ends is the hole's shape (``dice.assistant.shape``: a statement for a mask alone on its line,
an expression inside one, a block for a whole body), carried in ``InfillRequest.shape`` for the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dice.assistant.shape import HoleShape, hole_shape
from dice.cuda_source.positions import decode_bytes
from dice.cuda_source.window import line_aligned_span, trim_context
from engine.model_settings import HoleCut

if TYPE_CHECKING:
    from dice.cuda_source import CudaDocument

# The per-model hole cut (dice.json beside the weights): engine.model_settings (BiC-RL reads it too).


@dataclass(frozen=True)
class Hole:
    """A span of the document to fill: an explicit mask comment, or a zero-width cursor position.

    ``index`` is the mask index (-1 for the implicit hole at a cursor); bytes are UTF-8 offsets.
    """

    index: int
    start_byte: int
    end_byte: int
    budget: int | None
    function_start_byte: int | None = None
    function_end_byte: int | None = None


@dataclass(frozen=True)
class InfillRequest:
    """What the engine is asked; ``line_aligned``: the hole was widened to whole lines (prefix ends at the
    mask's line start, suffix starts after its last line's break) and fills go through ``mask_fill``.
    ``shape``: where a fill of the hole ends (``dice.assistant.shape``; None: at the suffix only), passed to
    ``engine.infill(shape=...)``."""

    prefix: str
    suffix: str
    context: str | None
    max_new_tokens: int
    line_aligned: bool = False
    shape: HoleShape | None = None

    def key(self) -> tuple[str, str, str | None, int, bool, str | None]:
        return (self.prefix, self.suffix, self.context, self.max_new_tokens, self.line_aligned, self.shape)

    def mask_fill(self, middle: str) -> str:
        """The text that replaces the mask comment's own range, given the engine's middle. A byte-cut hole
        that starts its line after the indentation (the prefix's last line is blanks only) keeps the file's
        indentation: the first line's leading blanks a model writes again (" x = 1;") are dropped."""
        if self.line_aligned:
            return line_middle_to_mask_fill(middle)
        last_line = self.prefix[self.prefix.rfind("\n") + 1 :]
        if last_line and not last_line.strip(" \t"):
            return middle.lstrip(" \t")
        return middle


# the line break (and blanks before it) that ends a line-aligned middle: the file keeps its own after the mask
_LAST_BREAK = re.compile(r"[ \t]*\r?\n\Z")


def line_middle_to_mask_fill(middle: str) -> str:
    """Map a middle generated for a whole-line hole onto the mask comment's range.

    The file keeps the indentation before the comment and the line break after it, so the first line's
    leading blanks and one final line break are dropped; later lines keep the indentation generated.
    "            acc += a;\n" -> "acc += a;"; "    x = 1;\n    y = 2;\n" -> "x = 1;\n    y = 2;".
    """
    text = middle.lstrip(" \t")  # stops at the first line break: only the first line's indentation
    return _LAST_BREAK.sub("", text, count=1)


def spec_context(doc: CudaDocument) -> str | None:
    """The dice-spec reference as the prompt's context block, or None without a spec."""
    if doc.spec is None or not doc.spec.source.strip():
        return None
    return "# dice-spec: Python reference for the kernels in this file\n" + doc.spec.source.rstrip() + "\n"


def build_infill_request(
    doc: CudaDocument,
    hole: Hole,
    *,
    default_max_new_tokens: int,
    budget_chars: int | None,
    prefix_weight: int = 2,
    hole_cut: HoleCut = "byte",
    shaped: bool = True,
) -> InfillRequest:
    """The prompt pieces for ``hole``; ``budget_chars`` caps ``prefix_weight * len(prefix) + len(suffix)``
    in UTF-8 bytes (None: no cap). The weight is 2 because DICE's infilling format shows the prefix twice
    (in the question, and again as the pre-filled start of the answer).

    A ``<MASK:N>`` budget caps the new tokens at N. The dice-spec comment is cut out of prefix/suffix when
    it is passed as context (it would otherwise appear twice); every other byte of the file, other masks
    included, stays as written. When the file does not fit, the enclosing function is kept whole (if it
    fits) and the rest of the file is cut at line boundaries, more of it before the hole than after.

    ``hole_cut`` "line": a mask alone on its line(s) becomes a whole-line hole (``line_aligned_span``);
    the request is then ``line_aligned`` and its fills must go through ``InfillRequest.mask_fill``.

    ``shaped``: the request carries the hole's shape (``hole_shape``: a statement for a mask alone on its
    line, an expression inside one, ...), else None (fills end at the suffix only). A budget still caps it.
    """
    data = doc.data
    max_new = min(hole.budget, default_max_new_tokens) if hole.budget else default_max_new_tokens
    context = spec_context(doc)

    span = line_aligned_span(data, hole.start_byte, hole.end_byte) if hole_cut == "line" else None
    start, end = span if span is not None else (hole.start_byte, hole.end_byte)
    fstart = hole.function_start_byte if hole.function_start_byte is not None else start
    fend = hole.function_end_byte if hole.function_end_byte is not None else end
    fstart, fend = min(fstart, start), max(fend, end)
    cut = (0, 0)  # the dice-spec comment's bytes, left out of prefix/suffix when it is the context
    if context is not None and doc.spec is not None:
        s, e = doc.spec.start_byte, doc.spec.end_byte
        if e <= start or s >= end:
            cut = (s, e)
    before = data[: min(cut[0], start)] + data[min(cut[1], start) : start]
    after = data[end : max(cut[0], end)] + data[max(cut[1], end) :]
    # before[keep_before:] and after[:keep_after] are the enclosing function around the hole
    keep_before = fstart - _overlap((0, fstart), cut)
    keep_after = (fend - end) - _overlap((end, fend), cut)

    if budget_chars is not None:
        before, after = trim_context(
            before, after, max(0, budget_chars), keep_before, keep_after, prefix_weight
        )

    return InfillRequest(
        prefix=decode_bytes(before),
        suffix=decode_bytes(after),
        context=context,
        max_new_tokens=max_new,
        line_aligned=span is not None,
        shape=shape_of(doc, hole) if shaped else None,
    )


def shape_of(doc: CudaDocument, hole: Hole) -> HoleShape:
    """The shape of ``hole`` in ``doc`` (``dice.assistant.shape.hole_shape``; outside functions: "block")."""
    return hole_shape(
        doc.data, hole.start_byte, hole.end_byte, in_function=hole.function_start_byte is not None
    )


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))
