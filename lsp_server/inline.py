"""Inline completion: which mask a request is about, the items it returns, and request scheduling.

Scheduling rules (issue 5): a newer request for a document cancels the older one; automatic requests
wait an adaptive debounce first; results for a stale document version are dropped by the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from lsprotocol import types

from dice.assistant.types import Candidate
from dice.cuda_source import CudaDocument, Mask
from dice.validator import Verdict
from dice.validator.verdict import first_line, verdict_label
from lsp_server.convert import lsp_range


def contains(rng: types.Range, pos: types.Position) -> bool:
    """Inclusive at both ends: a cursor right after ``/* <MASK> */`` is still at the mask."""
    start = (rng.start.line, rng.start.character)
    end = (rng.end.line, rng.end.character)
    return start <= (pos.line, pos.character) <= end


def mask_at(masks: Sequence[Mask], pos: types.Position) -> Mask | None:
    """The ``dice.cuda_source.Mask`` under the cursor, if any."""
    for mask in masks:
        if contains(lsp_range(mask.range), pos):
            return mask
    return None


def is_single_line(rng: types.Range) -> bool:
    return rng.start.line == rng.end.line


ACCEPTED_COMMAND = "dice.suggestionAccepted"  # client-side: carries the verdict label of an item


def suggestion_label(candidate: Candidate, usable: bool) -> str:
    """What a client shows beside a suggestion: its verdict label, and for one that failed validation (shown
    only because nothing passed) its first error."""
    label = verdict_label(candidate.verdict)
    if not usable and candidate.verdict is not None and first_line(candidate.verdict.message):
        label += " · " + first_line(candidate.verdict.message)
    return label


def completion_items(
    candidates: Sequence[Candidate],
    rng: types.Range,
    *,
    limit: int,
    prefix: str = "",
    uri: str = "",
    usable: bool = True,
) -> list[types.InlineCompletionItem]:
    """Items for ranked ``dice.assistant.Candidate``s (best first), replacing ``rng``.

    ``prefix`` is the text of a selected completion item the suggestion must start with; duplicates
    (same text) are dropped so cycling shows distinct suggestions. Each item's ``command`` carries its label
    (``dice.suggestionAccepted``, ``{"uri", "label", "usable"}``): clients show it beside the suggestion.
    """
    items: list[types.InlineCompletionItem] = []
    seen: set[str] = set()
    for cand in candidates:
        text = prefix + cand.text
        if not cand.text.strip() or text in seen:
            continue
        seen.add(text)
        label = suggestion_label(cand, usable)
        command = types.Command(
            title=label, command=ACCEPTED_COMMAND, arguments=[{"uri": uri, "label": label, "usable": usable}]
        )
        items.append(
            types.InlineCompletionItem(
                insert_text=text, range=rng, filter_text=prefix or None, command=command
            )
        )
        if len(items) >= limit:
            break
    return items


def suggestion_status(candidates: Sequence[Candidate], usable: int, shown: int) -> str | None:
    """The message a client shows when no candidate passed validation (None when one did)."""
    if usable:
        return None
    if not candidates:
        return "no suggestion: every fill the model gave was blank"
    n = len(candidates)
    compiled = any(c.verdict is not None and c.verdict.compiled for c in candidates)
    what = "passed validation" if compiled else "compiled"
    best = candidates[0].verdict
    detail = first_line(best.message) if best is not None else ""
    text = f"{n} candidate{'s' if n != 1 else ''}, none {what}"
    return text + (f": {detail}" if detail else "")


def candidate_labels(candidates: Sequence[Candidate]) -> list[str]:
    return [verdict_label(c.verdict) for c in candidates]


class AdaptiveDebounce:
    """How long an automatic request waits before running the model.

    It follows the user's typing rhythm: the median gap between recent edits of the document, times 1.5,
    clamped to [min_s, max_s]. Fast typists get a short wait (a newer request would cancel the
    older anyway); slow or paused typing gets a quick answer.
    """

    def __init__(self, min_s: float = 0.05, max_s: float = 0.6, history: int = 8) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self._edits: dict[str, deque[float]] = {}
        self._history = history

    def record_edit(self, uri: str, now: float | None = None) -> None:
        self._edits.setdefault(uri, deque(maxlen=self._history + 1)).append(
            time.monotonic() if now is None else now
        )

    def forget(self, uri: str) -> None:
        self._edits.pop(uri, None)

    def delay(self, uri: str, now: float | None = None) -> float:
        times = self._edits.get(uri)
        if not times or len(times) < 2:
            return self.min_s
        now = time.monotonic() if now is None else now
        if now - times[-1] > self.max_s:
            return self.min_s  # the user paused: answer now
        gaps = [b - a for a, b in zip(times, list(times)[1:], strict=False)]
        return min(self.max_s, max(self.min_s, 1.5 * statistics.median(gaps)))


@dataclass
class Ticket:
    uri: str
    seq: int
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


class RequestTracker:
    """The one live inline request per document; starting another cancels the older one."""

    def __init__(self) -> None:
        self._live: dict[str, Ticket] = {}
        self._seq = 0

    def start(self, uri: str) -> Ticket:
        self._seq += 1
        older = self._live.get(uri)
        if older is not None:
            older.cancel.set()
        ticket = Ticket(uri=uri, seq=self._seq)
        self._live[uri] = ticket
        return ticket

    def is_live(self, ticket: Ticket) -> bool:
        return self._live.get(ticket.uri) is ticket and not ticket.cancel.is_set()

    def finish(self, ticket: Ticket) -> None:
        if self._live.get(ticket.uri) is ticket:
            del self._live[ticket.uri]

    def cancel_document(self, uri: str) -> None:
        ticket = self._live.pop(uri, None)
        if ticket is not None:
            ticket.cancel.set()

    def cancel_all(self) -> None:
        for uri in list(self._live):
            self.cancel_document(uri)


@dataclass(frozen=True)
class InlinePlan:
    """What one inline request asks the assistant for."""

    text: str  # the text the model completes: the document, or it with the selected completion applied
    mask_index: int | None  # an explicit mask, or None: the implicit mask at ``byte_offset``
    byte_offset: int  # where the suggestion starts, in ``text`` (and in the document)
    range: types.Range  # what the items replace (single line)
    prefix: str = ""  # selected completion text the items must start with


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(frozen=True)
class Shown:
    """Suggestions returned at a cursor (not at a mask): where they start and what surrounds them, as digests
    of the document's bytes before the start and after the cursor (the document itself is not kept)."""

    start_byte: int  # where the suggestions begin (the cursor of the request that produced them)
    before: bytes  # digest of data[:start_byte]
    after: bytes  # digest of data[cursor:], the same for every request typed into the suggestion
    texts: tuple[str, ...]
    verdicts: tuple[Verdict | None, ...]

    @classmethod
    def at(cls, data: bytes, cursor: int, texts: Sequence[str], verdicts: Sequence[Verdict | None]) -> Shown:
        return cls(cursor, _digest(data[:cursor]), _digest(data[cursor:]), tuple(texts), tuple(verdicts))

    def typed_through(self, data: bytes, cursor: int) -> tuple[str, list[str], list[Verdict | None]] | None:
        """When the text between ``start_byte`` and ``cursor`` is the start of some suggestions and nothing
        else changed: (what was typed, the rest of each such suggestion, their verdicts); else None.

        The document with a rest inserted equals the one with the whole suggestion inserted, so verdicts
        carry over: typing what is shown keeps it shown, without asking the model again (as Copilot does).
        """
        if cursor <= self.start_byte or cursor > len(data):
            return None
        if _digest(data[cursor:]) != self.after or _digest(data[: self.start_byte]) != self.before:
            return None
        try:
            typed = data[self.start_byte : cursor].decode("utf-8")
        except UnicodeDecodeError:
            return None
        rests, verdicts = [], []
        for text, verdict in zip(self.texts, self.verdicts, strict=True):
            if text.startswith(typed) and text[len(typed) :].strip():
                rests.append(text[len(typed) :])
                verdicts.append(verdict)
        return (typed, rests, verdicts) if rests else None


def plan_inline(
    text: str,
    doc: CudaDocument,
    position: types.Position,
    selected: types.SelectedCompletionInfo | None = None,
) -> InlinePlan | None:
    """Decide what a request at ``position`` completes; None when there is nothing to suggest there.

    At a (single-line) mask comment: that mask, replacing the comment. Where
    ``dice.assistant.rules.implicit_mask_at`` finds a hole (a kernel or device-function body): the implicit
    mask at the cursor. With a selected completion item, the item's
    text is applied first and suggestions continue it (their range is the item's range).
    """
    from dice.assistant.rules import implicit_mask_at
    from dice.cuda_source import Position, PositionIndex, parse_document

    # the document's own index when it is of this text: a big file is not indexed again for each request
    index = doc.index if doc.index is not None and doc.text == text else PositionIndex(text)
    try:
        cursor = index.position_to_byte(Position(position.line, position.character))
    except (ValueError, IndexError):
        return None

    if selected is not None and selected.text:
        try:
            start = index.position_to_byte(
                Position(selected.range.start.line, selected.range.start.character)
            )
            end = index.position_to_byte(Position(selected.range.end.line, selected.range.end.character))
        except (ValueError, IndexError):
            return None
        if not (start <= end and is_single_line(selected.range)):
            return None
        data = text.encode("utf-8", errors="surrogatepass")
        inserted = selected.text.encode("utf-8")
        new_text = (data[:start] + inserted + data[end:]).decode("utf-8", errors="surrogatepass")
        offset = start + len(inserted)
        if not implicit_mask_at(parse_document(new_text), offset) is not None:
            return None
        return InlinePlan(new_text, None, offset, selected.range, prefix=selected.text)

    mask = mask_at(doc.masks, position)
    if mask is not None:
        rng = lsp_range(mask.range)
        if not is_single_line(rng):
            return None  # a multi-line mask comment is filled by the "Fill this mask" command
        return InlinePlan(text, mask.index, mask.start_byte, rng)
    if implicit_mask_at(doc, cursor) is not None:
        return InlinePlan(text, None, cursor, types.Range(start=position, end=position))
    return None
