"""One choice's text as its tokens arrive block by block: stop strings, the token budget, and the part of
the text a stream may already send.

A stream never sends text it may have to take back: characters that could still begin a stop string, and a
trailing U+FFFD, which is what an incomplete UTF-8 sequence decodes to until its next token arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"


class Detokenizer(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class ChoiceText:
    """The text of one choice. ``update`` is given the row's new tokens so far (they only grow);
    ``finish_reason`` is "stop" (a stop token or string), "length" (``max_tokens``) or None (running)."""

    def __init__(self, tokenizer: Detokenizer, *, max_tokens: int, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.sent_chars = 0  # characters of ``text`` already handed out by ``take_delta``
        self.sent_tokens = 0  # tokens of ``ids`` already handed out
        self._seen = -1

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, ids: Sequence[int], *, done: bool = False, stopped: bool = False) -> None:
        """The row holds ``ids`` (``done``: the decoder ended it; ``stopped``: by a stop token or our own
        ``until``, not by its budget). Idempotent for the same ids."""
        if self.finished:
            return
        if len(ids) != self._seen:
            self._seen = len(ids)
            kept = list(ids[: self.max_tokens])
            text = self.tokenizer.decode(kept)
            cut = self._stop_at(text)
            if cut is not None:
                self.ids, self.text = self._tokens_through(kept, cut), text[: cut[0]]
                self.finish_reason = "stop"
                return
            self.ids, self.text = kept, text
            if len(ids) >= self.max_tokens:
                self.finish_reason = "length"
                return
        if done:
            self.finish_reason = "stop" if stopped else "length"

    def _stop_at(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the earliest stop string in ``text``."""
        best = None
        for s in self.stop:
            at = text.find(s)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, at + len(s))
        return best

    def _tokens_through(self, ids: list[int], cut: tuple[int, int]) -> list[int]:
        """The fewest leading tokens whose text holds the whole stop string (what usage counts)."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tokenizer.decode(ids[:mid])) >= cut[1]:
                hi = mid
            else:
                lo = mid + 1
        return ids[:lo]

    def _stop_prefix_tail(self, end: int) -> int:
        """Length of the longest tail of ``text[:end]`` that begins some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, end), best, -1):
                if self.text.endswith(s[:k], 0, end):
                    best = k
                    break
        return best

    def take_delta(self) -> tuple[str, list[int]]:
        """The text and tokens not handed out yet that are final: all of it once finished; while running,
        minus a tail that could start a stop string and a trailing incomplete character."""
        safe = len(self.text)
        if not self.finished:
            while safe > self.sent_chars and self.text[safe - 1] == REPLACEMENT:
                safe -= 1
            safe = max(self.sent_chars, safe - self._stop_prefix_tail(safe))
        text = self.text[self.sent_chars : safe]
        self.sent_chars = max(self.sent_chars, safe)
        tokens = self.ids[self.sent_tokens :]
        self.sent_tokens = len(self.ids)
        return text, tokens
