"""Client settings: nested dataclasses with defaults, parsed leniently from the ``dice`` settings object.

The wire keys are the flat camelCase names of ``vscode-client/package.json`` (``dice.<key>``), fixed in
docs/INTERNALS.md. Each bad value is reported and replaced by its default; parsing never raises.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("static", "dynamic", "entropy")
DEVICES = ("auto", "cpu", "cuda")
VALIDATION_LEVELS = ("none", "compile", "run")


@dataclass(frozen=True)
class ModelSettings:
    path: str = ""  # "" = the embedded model ($DICE_MODEL, then engine/models/dice-tiny)
    device: str = "auto"


@dataclass(frozen=True)
class DecodingSettings:
    candidates: int = 3
    block_size: int = 4
    steps_per_block: int = 4
    policy: str = "dynamic"
    threshold: float = 0.9
    max_new_tokens: int = 256


@dataclass(frozen=True)
class SuggestionSettings:
    automatic_trigger: bool = True
    max_latency_ms: int = 2000


@dataclass(frozen=True)
class ValidationSettings:
    level: str = "run"


@dataclass(frozen=True)
class DiceSettings:
    model: ModelSettings = field(default_factory=ModelSettings)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    suggestions: SuggestionSettings = field(default_factory=SuggestionSettings)
    validation: ValidationSettings = field(default_factory=ValidationSettings)

    def to_assistant_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``dice.assistant.AssistantSettings``."""
        return {
            "model_path": self.model.path or None,
            "device": self.model.device,
            "candidates": self.decoding.candidates,
            "block_size": self.decoding.block_size,
            "steps_per_block": self.decoding.steps_per_block,
            "policy": self.decoding.policy,
            "threshold": self.decoding.threshold,
            "max_latency_ms": self.suggestions.max_latency_ms,
            "validation_level": self.validation.level,
            "max_new_tokens": self.decoding.max_new_tokens,
        }

    def model_key(self) -> tuple[str, str]:
        """What forces a model reload when it changes."""
        return (self.model.path, self.model.device)


Check = Callable[[Any], Any]  # returns the cleaned value or raises ValueError with the reason


def _string(choices: tuple[str, ...] | None = None) -> Check:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("expected a string")
        if choices is not None and value not in choices:
            raise ValueError(f"expected one of {', '.join(repr(c) for c in choices)}")
        return value

    return check


def _integer(low: int, high: int) -> Check:
    def check(value: Any) -> int:
        # JSON clients may send 3.0 for 3; booleans are ints in Python but never a valid count.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected an integer")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError("expected an integer")
        if not low <= value <= high:
            raise ValueError(f"expected an integer in [{low}, {high}]")
        return int(value)

    return check


def _number(low: float, high: float) -> Check:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError("expected a number")
        if not low <= value <= high:
            raise ValueError(f"expected a number in [{low}, {high}]")
        return float(value)

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


# wire key -> (section attribute, field name, check)
KEYS: dict[str, tuple[str, str, Check]] = {
    "modelPath": ("model", "path", _string()),
    "device": ("model", "device", _string(DEVICES)),
    "candidates": ("decoding", "candidates", _integer(1, 16)),
    "blockSize": ("decoding", "block_size", _integer(1, 64)),
    "stepsPerBlock": ("decoding", "steps_per_block", _integer(1, 64)),
    "policy": ("decoding", "policy", _string(POLICIES)),
    "threshold": ("decoding", "threshold", _number(0.0, 1.0)),
    "maxNewTokens": ("decoding", "max_new_tokens", _integer(1, 4096)),
    "automaticTrigger": ("suggestions", "automatic_trigger", _boolean),
    "maxLatencyMs": ("suggestions", "max_latency_ms", _integer(50, 600_000)),
    "validationLevel": ("validation", "level", _string(VALIDATION_LEVELS)),
}


@dataclass(frozen=True)
class ParsedSettings:
    settings: DiceSettings
    problems: list[str]  # bad values, each replaced by its default: shown to the user
    unknown: list[str]  # keys this server does not read (client-only settings): logged only


def parse_settings(raw: Any) -> ParsedSettings:
    """Settings from the ``dice`` object; missing keys take defaults, bad values are reported.

    ``raw`` may also be ``{"dice": {...}}`` (the didChangeConfiguration shape) or None.
    """
    problems: list[str] = []
    unknown: list[str] = []
    if raw is None:
        return ParsedSettings(DiceSettings(), problems, unknown)
    if isinstance(raw, Mapping) and isinstance(raw.get("dice"), Mapping) and set(raw) == {"dice"}:
        raw = raw["dice"]
    if not isinstance(raw, Mapping):
        problem = f"dice settings: expected an object, got {type(raw).__name__}; using the defaults"
        return ParsedSettings(DiceSettings(), [problem], unknown)

    sections: dict[str, dict[str, Any]] = {
        name: {} for name in ("model", "decoding", "suggestions", "validation")
    }
    for key, value in raw.items():
        if key not in KEYS:
            unknown.append(str(key))
            continue
        if value is None:
            continue
        section, name, check = KEYS[key]
        try:
            sections[section][name] = check(value)
        except ValueError as exc:
            default = getattr(getattr(DiceSettings(), section), name)
            problems.append(f"dice.{key}: {exc}, got {value!r}; using the default {default!r}")
    settings = DiceSettings(
        model=ModelSettings(**sections["model"]),
        decoding=DecodingSettings(**sections["decoding"]),
        suggestions=SuggestionSettings(**sections["suggestions"]),
        validation=ValidationSettings(**sections["validation"]),
    )
    return ParsedSettings(settings, problems, unknown)


def settings_to_wire(settings: DiceSettings) -> dict[str, Any]:
    """The inverse of :func:`parse_settings`: the flat camelCase ``dice`` object."""
    return {key: getattr(getattr(settings, section), name) for key, (section, name, _check) in KEYS.items()}


def replace_section(settings: DiceSettings, section: str, **changes: Any) -> DiceSettings:
    """A copy with some fields of one section changed (e.g. toggling automatic suggestions)."""
    return dataclasses.replace(
        settings, **{section: dataclasses.replace(getattr(settings, section), **changes)}
    )
