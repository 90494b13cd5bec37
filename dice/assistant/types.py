"""Value types of the assistant service: settings, progress events and results (see docs/INTERNALS.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from lsprotocol.types import TextEdit

    from dice.cuda_source import Mask
    from dice.validator import Verdict

ValidationLevel = Literal["none", "compile", "run"]
Stage = Literal["loading", "generating", "validating"]

# Default new-token budget of a whole generated program (DICE evaluates with up to 4096).
PROGRAM_MAX_NEW_TOKENS = 2048

_POLICIES = ("static", "dynamic", "entropy")
_DEVICES = ("auto", "cpu", "cuda")
_LEVELS = ("none", "compile", "run")


@dataclass(frozen=True)
class AssistantSettings:
    """What the user can configure; mirrors the LSP/VS Code ``dice.*`` settings (INTERNALS.md).

    ``max_latency_ms`` <= 0 means no latency budget (the command line's default). Candidate 0 of every
    mask is greedy; the others are sampled at ``sample_temperature`` from ``seed`` so that a request is
    reproducible (and therefore cacheable).
    """

    model_path: str | None = None
    device: str = "auto"
    candidates: int = 3
    block_size: int = 4
    steps_per_block: int = 4
    policy: str = "dynamic"
    threshold: float = 0.9
    max_latency_ms: int = 2000
    validation_level: ValidationLevel = "run"
    max_new_tokens: int = 256
    sample_temperature: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.device not in _DEVICES and not self.device.startswith("cuda:"):
            problems.append(f"device must be one of {', '.join(_DEVICES)} (or cuda:N), got {self.device!r}")
        if self.policy not in _POLICIES:
            problems.append(f"policy must be one of {', '.join(_POLICIES)}, got {self.policy!r}")
        if self.validation_level not in _LEVELS:
            problems.append(
                f"validation_level must be one of {', '.join(_LEVELS)}, got {self.validation_level!r}"
            )
        for name in ("candidates", "block_size", "steps_per_block", "max_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if self.policy == "entropy":  # there the threshold is an entropy budget in nats
            if not self.threshold > 0.0:
                problems.append(f"threshold must be > 0 for the entropy policy, got {self.threshold!r}")
        elif not 0.0 < self.threshold <= 1.0:
            problems.append(f"threshold must be in (0, 1], got {self.threshold!r}")
        if self.sample_temperature <= 0.0:
            problems.append(f"sample_temperature must be > 0, got {self.sample_temperature!r}")
        if problems:
            raise ValueError("; ".join(problems))

    def replace(self, **changes: Any) -> AssistantSettings:
        return dataclasses.replace(self, **changes)

    def decode_key(self) -> tuple[Any, ...]:
        """The settings that change what the model produces (part of every cache key)."""
        return (
            self.block_size,
            self.steps_per_block,
            self.policy,
            self.threshold,
            self.max_new_tokens,
            self.sample_temperature,
            self.seed,
        )


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
