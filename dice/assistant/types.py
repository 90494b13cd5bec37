"""Value types of the assistant service: progress events and results (see docs/INTERNALS.md); the settings
are in ``dice.assistant.settings``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dice.cuda_source import Mask, TextEdit
    from dice.validator import Verdict

Stage = Literal["loading", "generating", "validating"]


@dataclass(frozen=True)
class Progress:
    """One progress event. ``total`` is an upper bound while generating (dynamic decoding ends early)."""

    stage: Stage
    done: int
    total: int
    message: str


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str | None  # None for the embedded model
    device: str
    parameters: int
    dtype: str

    def describe(self) -> str:
        if self.dtype == "remote":  # a served model: its size and precision are the server's business
            return f"{self.name} on the {self.device.replace('server ', 'server at ', 1)}"
        return f"{self.name} ({format_parameters(self.parameters)} parameters, {self.dtype}) on {self.device}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Candidate:
    """One fill of a mask. ``verdict`` is the verdict of the whole file with this fill spliced in (the other
    masks holding their best fill at the time), or None when ``validation_level`` is "none".
    ``rank`` is 0 for the best candidate of its mask."""

    text: str
    verdict: Verdict | None
    confidence: float
    rank: int
    tokens: int | None = None  # new tokens the model generated for it (None when the engine does not say)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "text": self.text,
            "confidence": self.confidence,
            "tokens": self.tokens,
            "verdict": None if self.verdict is None else self.verdict.to_json(),
        }


@dataclass(frozen=True)
class MaskCompletion:
    """The candidates of one mask, best first; ``mask.index`` is -1 for ``complete_at``'s implicit mask."""

    mask: Mask
    candidates: list[Candidate]

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.mask.to_json(),
            "index": self.mask.index,
            "candidates": [c.to_json() for c in self.candidates],
        }


@dataclass(frozen=True)
class DocumentCompletion:
    """The result of filling some masks of a document.

    ``best_text`` is the document with every mask's best candidate spliced in (other bytes unchanged) and
    ``edits`` the minimal LSP edits from the input text to it. ``best_verdict`` is the verdict of
    ``best_text`` (None when nothing was validated). ``partial`` is True when the latency budget cut the
    work short (candidates not validated in time are left out).
    """

    masks: list[MaskCompletion]
    best_text: str
    edits: list[TextEdit]
    from_cache: bool
    best_verdict: Verdict | None = None
    partial: bool = False
    model: ModelInfo | None = None
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def any_compiled(self) -> bool:
        return any(c.verdict is not None and c.verdict.compiled for m in self.masks for c in m.candidates)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": None if self.model is None else self.model.to_json(),
            "masks": [m.to_json() for m in self.masks],
            "best_verdict": None if self.best_verdict is None else self.best_verdict.to_json(),
            "partial": self.partial,
            "from_cache": self.from_cache,
            # seconds (generate_s, greedy_s, validate_s, total_s) and counts (steps, empty_fills, duplicates)
            "timings": {k: round(v, 4) if isinstance(v, float) else v for k, v in self.stats.items()},
        }


@dataclass(frozen=True)
class RankedProgram:
    """One whole generated program (KernelBench ``ModelNew`` source) with its verdict; best first in lists."""

    source: str
    verdict: Verdict | None
    confidence: float

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "confidence": self.confidence,
            "verdict": None if self.verdict is None else self.verdict.to_json(),
        }


def format_parameters(count: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{suffix}"
    return str(count)
