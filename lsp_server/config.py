"""Client settings: nested dataclasses with defaults, read leniently from the ``dice`` settings object.

The keys, defaults, bounds and choices are the one table ``dice.assistant.settings.SETTINGS`` (which the
VS Code schema is tested against); this module only groups the editor's settings into sections. Each bad
value is reported and replaced by its default; parsing never raises.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from dice.assistant.settings import (
    BY_NAME,
    AssistantSettings,
    editor_settings_to_wire,
    parse_editor_settings,
)


def _default(name: str) -> Any:
    return BY_NAME[name].default


@dataclass(frozen=True)
class ModelSettings:
    path: str = _default("model_path")  # "" = the embedded model ($DICE_MODEL, then the packaged dice-tiny)
    device: str = _default("device")
    server: str = _default("server")  # "" = $DICE_SERVER, else the model runs in this process
    server_model: str = _default("server_model")


@dataclass(frozen=True)
class DecodingSettings:
    candidates: int = _default("candidates")
    block_size: int = _default("block_size")
    steps_per_block: int = _default("steps_per_block")
    policy: str = _default("policy")
    threshold: float = _default("threshold")
    max_new_tokens: int = _default("max_new_tokens")


@dataclass(frozen=True)
class SuggestionSettings:
    automatic_trigger: bool = _default("automatic_trigger")
    max_latency_ms: int = _default("max_latency_ms")
    show_failing: bool = _default("show_failing_suggestions")


@dataclass(frozen=True)
class ValidationSettings:
    level: str = _default("validation_level")
    compile_commands: str = _default("compile_commands")  # "" = discovered beside the file
    include_paths: tuple[str, ...] = _default("include_paths")
    defines: tuple[str, ...] = _default("defines")
    trusted: bool = _default("trusted_workspace")  # False: compile-only, no spec or reference is run


# Python setting name -> (section, field) of DiceSettings
SECTIONS: dict[str, tuple[str, str]] = {
    "model_path": ("model", "path"),
    "device": ("model", "device"),
    "server": ("model", "server"),
    "server_model": ("model", "server_model"),
    "candidates": ("decoding", "candidates"),
    "block_size": ("decoding", "block_size"),
    "steps_per_block": ("decoding", "steps_per_block"),
    "policy": ("decoding", "policy"),
    "threshold": ("decoding", "threshold"),
    "max_new_tokens": ("decoding", "max_new_tokens"),
    "automatic_trigger": ("suggestions", "automatic_trigger"),
    "max_latency_ms": ("suggestions", "max_latency_ms"),
    "validation_level": ("validation", "level"),
    "compile_commands": ("validation", "compile_commands"),
    "include_paths": ("validation", "include_paths"),
    "defines": ("validation", "defines"),
    "trusted_workspace": ("validation", "trusted"),
    "show_failing_suggestions": ("suggestions", "show_failing"),
}


@dataclass(frozen=True)
class DiceSettings:
    model: ModelSettings = field(default_factory=ModelSettings)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    suggestions: SuggestionSettings = field(default_factory=SuggestionSettings)
    validation: ValidationSettings = field(default_factory=ValidationSettings)

    def values(self) -> dict[str, Any]:
        """Every setting by its Python name (``dice.assistant.settings``)."""
        return {name: getattr(getattr(self, section), attr) for name, (section, attr) in SECTIONS.items()}

    def assistant_settings(self) -> AssistantSettings:
        """What the assistant service runs with (the editor-only settings left out)."""
        kwargs = {name: v for name, v in self.values().items() if BY_NAME[name].assistant}
        kwargs["model_path"] = kwargs["model_path"] or None
        return AssistantSettings(**kwargs)

    def to_assistant_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``dice.assistant.AssistantSettings``."""
        return dataclasses.asdict(self.assistant_settings())

    def server_url(self) -> str:
        """The model server in use ("": the model runs here): ``dice.server``, else $DICE_SERVER."""
        return self.model.server.strip() or os.environ.get("DICE_SERVER", "").strip()

    def model_key(self) -> tuple[str, ...]:
        """What forces a model reload when it changes."""
        m = self.model
        return (m.path, m.device, m.server, m.server_model)

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> DiceSettings:
        sections: dict[str, dict[str, Any]] = {
            "model": {},
            "decoding": {},
            "suggestions": {},
            "validation": {},
        }
        for name, (section, attr) in SECTIONS.items():
            sections[section][attr] = values[name]
        return cls(
            model=ModelSettings(**sections["model"]),
            decoding=DecodingSettings(**sections["decoding"]),
            suggestions=SuggestionSettings(**sections["suggestions"]),
            validation=ValidationSettings(**sections["validation"]),
        )


@dataclass(frozen=True)
class ParsedSettings:
    settings: DiceSettings
    problems: list[str]  # bad values, each replaced by its default: shown to the user
    unknown: list[str]  # keys this server does not read (client-only settings): logged only


def parse_settings(raw: Any) -> ParsedSettings:
    """Settings from the ``dice`` object (or ``{"dice": {...}}``, or None); missing keys take defaults,
    bad values are reported (``dice.assistant.settings.parse_editor_settings``)."""
    parsed = parse_editor_settings(raw)
    return ParsedSettings(DiceSettings.from_values(parsed.values), parsed.problems, parsed.unknown)


def settings_to_wire(settings: DiceSettings) -> dict[str, Any]:
    """The inverse of :func:`parse_settings`: the flat camelCase ``dice`` object."""
    return editor_settings_to_wire(settings.values())


def replace_section(settings: DiceSettings, section: str, **changes: Any) -> DiceSettings:
    """A copy with some fields of one section changed (e.g. toggling automatic suggestions)."""
    return dataclasses.replace(
        settings, **{section: dataclasses.replace(getattr(settings, section), **changes)}
    )
