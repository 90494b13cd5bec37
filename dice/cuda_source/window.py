"""Byte windows of a file around a hole: which text before and after it goes into an infilling prompt.

Pure functions over UTF-8 bytes (no parser, no model): the assistant's prompts (``dice.assistant.prompting``)
and the training corpus of the embedded model (``training.embedded``) both cut holes and trim their context
with these, so the model is trained on exactly the windows it is prompted with.
"""

from __future__ import annotations


def line_aligned_span(data: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The whole lines holding ``data[start:end]`` when nothing but blanks shares them, else None.

    Returns (start of the first line, start of the line after the last one, or len(data) at the end of
    the file). A zero-width span (a cursor) is never widened.
    """
    if end <= start:
        return None
    line_start = data.rfind(b"\n", 0, start) + 1
    if data[line_start:start].strip(b" \t"):
        return None
    newline = data.find(b"\n", end)
    line_end = len(data) if newline < 0 else newline + 1
    if data[end:line_end].strip(b" \t\r\n"):
        return None
    return line_start, line_end


def trim_context(
    before: bytes, after: bytes, budget: int, keep_before: int, keep_after: int, weight: int = 2
) -> tuple[bytes, bytes]:
    """Cut ``before`` from the left and ``after`` from the right, at line boundaries, so that
    ``weight * len(before) + len(after) <= budget`` (always: a cut never gives back more than it was told).

    ``before[keep_before:]`` and ``after[:keep_after]`` (the enclosing function) are kept whole when they fit;
    the spare budget goes two thirds to the text before the hole, which matters more for a fill. When the
    function alone does not fit, the text nearest the hole is kept (two thirds of the budget before it).
    ``weight`` is 2 for DICE's infilling format, which shows the prefix twice.
    """
    if weight * len(before) + len(after) <= budget:
        return before, after
    must_before = len(before) - keep_before
    must_after = keep_after
    if weight * must_before + must_after > budget:
        # the function alone is too long: keep the text nearest the hole
        share_before = min(must_before, (2 * budget) // (3 * weight))
        share_after = min(must_after, budget - weight * share_before)
        share_before = min(must_before, (budget - share_after) // weight)
    else:
        spare = budget - weight * must_before - must_after
        extra_before = min(keep_before, (2 * spare) // (3 * weight))
        extra_after = min(len(after) - must_after, spare - weight * extra_before)
        extra_before = min(keep_before, (spare - extra_after) // weight)
        share_before = must_before + extra_before
        share_after = must_after + extra_after
    return tail_at_line(before, share_before), head_at_line(after, share_after)


def hole_context(
    data: bytes, start: int, end: int, function: tuple[int, int] | None, budget: int, weight: int = 2
) -> tuple[bytes, bytes]:
    """The text before and after the hole ``data[start:end]``, trimmed by :func:`trim_context` to
    ``weight * len(before) + len(after) <= budget``, ``function`` (the enclosing function's byte span, if
    any) kept whole when it fits: a hole's prompt context for a file with nothing cut out of it."""
    fstart, fend = function if function is not None else (start, end)
    keep_before, keep_after = min(fstart, start), max(fend, end) - end
    return trim_context(data[:start], data[end:], max(0, budget), keep_before, keep_after, weight)


def tail_at_line(data: bytes, size: int) -> bytes:
    """At most the last ``size`` bytes of ``data``, starting at a line start (else at a whole character)."""
    if size >= len(data):
        return data
    if size <= 0:
        return b""
    tail = data[len(data) - size :]
    cut = tail.find(b"\n")
    # starting after a newline keeps UTF-8 sequences whole
    return tail[cut + 1 :] if cut >= 0 else _valid_utf8_tail(tail)


def head_at_line(data: bytes, size: int) -> bytes:
    """At most the first ``size`` bytes of ``data``, ending after a line break (else at a whole character)."""
    if size >= len(data):
        return data
    if size <= 0:
        return b""
    head = data[:size]
    cut = head.rfind(b"\n")
    return head[: cut + 1] if cut >= 0 else head.decode("utf-8", errors="ignore").encode("utf-8")


def _valid_utf8_tail(data: bytes) -> bytes:
    # skip UTF-8 continuation bytes (0b10xxxxxx) at the start
    i = 0
    while i < len(data) and (data[i] & 0xC0) == 0x80:
        i += 1
    return data[i:]


__all__ = ["head_at_line", "hole_context", "line_aligned_span", "tail_at_line", "trim_context"]
