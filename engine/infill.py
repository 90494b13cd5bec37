"""One infilling request as text: the prompt a model is given and how its answer becomes the middle.

The in-process engine (``Engine.infill``) and the remote one (``engine.remote.RemoteEngine``) both use it,
so a fill is taken out of an answer the same way whether the model ran here or behind an HTTP server.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.prompts import extract_middle, infill_prompt
from engine.shape import check_shape, cut_to_shape, shape_end


@dataclass(frozen=True)
class InfillPlan:
    """``prompt_text`` is what the model continues (DICE's infilling prompt, the response pre-filled with
    the code fence and the prefix); the generated text after it holds the middle."""

    prefix: str
    suffix: str
    shape: str | None
    prompt_text: str

    @classmethod
    def make(
        cls, prefix: str, suffix: str, *, context: str | None = None, shape: str | None = None
    ) -> InfillPlan:
        check_shape(shape)
        prompt, response_prefix = infill_prompt(prefix, suffix, context)
        return cls(prefix, suffix, shape, prompt + response_prefix)

    @property
    def starts_line(self) -> bool:
        return self.prefix == "" or self.prefix.endswith("\n")

    def middle(self, generated: str) -> tuple[str, bool]:
        """The middle in ``generated`` so far and whether the suffix's start (or the fence's end) was seen."""
        return extract_middle(generated, self.suffix, starts_line=self.starts_line)

    def reached_end(self, generated: str) -> bool:
        """Whether ``generated`` already holds the whole middle: the suffix starts, or a fill of the hole's
        shape ended (so decoding may stop)."""
        middle, found = self.middle(generated)
        return found or shape_end(middle, self.shape) is not None

    def finish(self, generated: str, done: bool) -> tuple[str, bool]:
        """The middle cut to the hole's shape, and whether the answer ended (``done``: the decoder stopped
        on a stop token) rather than ran out of tokens."""
        middle, found = self.middle(generated)
        middle, ended = cut_to_shape(middle, self.shape)
        return middle, found or ended or done
