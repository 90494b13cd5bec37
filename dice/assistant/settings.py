"""The user's settings: one table of names, defaults, bounds and choices, and the settings object built on it.

``SETTINGS`` is the only copy of these rules. ``AssistantSettings`` validates with it; the language server
parses the editor's ``dice`` object with it (``lsp_server.config``); the command line takes its defaults and
choices from it (``dice.commands.console``); and a test checks ``vscode-client/package.json`` (the schema VS
Code shows and enforces) and the TypeScript defaults against it, so a setting cannot drift between them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ValidationLevel = Literal["none", "compile", "run"]
Kind = Literal["string", "integer", "number", "boolean", "array"]  # array: of strings

POLICIES = ("static", "dynamic", "entropy")
DEVICES = ("auto", "cpu", "cuda")
VALIDATION_LEVELS = ("none", "compile", "run")

# Default new-token budget of a whole generated program (DICE evaluates with up to 4096).
PROGRAM_MAX_NEW_TOKENS = 2048


@dataclass(frozen=True)
class Setting:
    """One setting. ``name`` is the Python field (``AssistantSettings`` when ``assistant``); ``key`` the
    editor's ``dice.<key>`` (None: not an editor setting). The bounds are JSON Schema's: ``minimum`` and
    ``maximum`` inclusive, ``exclusive_minimum`` exclusive."""

    name: str
    key: str | None
    kind: Kind
    default: Any
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    pattern: str | None = None  # also accepted besides ``choices`` (device "cuda:N")
    # the ``maximum`` does not apply under this policy (the entropy policy's threshold is a budget in nats)
    unbounded_for_policy: str | None = None
    assistant: bool = True  # a field of AssistantSettings (False: only the language server reads it)

    def expected(self) -> str:
        """What a valid value is, in words (used in every message about a bad value)."""
        if self.kind == "boolean":
            return "true or false"
        if self.kind == "array":
            return "a list of strings"
        if self.kind == "string":
            if not self.choices:
                return "a string"
            extra = " (or cuda:N)" if self.pattern else ""
            return "one of " + ", ".join(repr(c) for c in self.choices) + extra
        noun = "an integer" if self.kind == "integer" else "a number"
        low = (
            f"({_num(self.exclusive_minimum)}"
            if self.exclusive_minimum is not None
            else f"[{_num(self.minimum)}"
            if self.minimum is not None
            else "(-inf"
        )
        high = f"{_num(self.maximum)}]" if self.maximum is not None else "inf)"
        text = f"{noun} in {low}, {high}"
        if self.unbounded_for_policy and self.maximum is not None:
            text += f" (any positive value with the {self.unbounded_for_policy} policy)"
        return text

    def check(self, value: Any, *, policy: str | None = None) -> Any:
        """The cleaned value, or ``ValueError("expected ...")``; ``policy`` is the one in effect."""
        if self.kind == "boolean":
            if not isinstance(value, bool):
                raise ValueError(f"expected {self.expected()}")
            return value
        if self.kind == "array":
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"expected {self.expected()}")
            return tuple(value)
        if self.kind == "string":
            if not isinstance(value, str):
                raise ValueError(f"expected {self.expected()}" if self.choices else "expected a string")
            if (
                self.choices
                and value not in self.choices
                and not (self.pattern and re.fullmatch(self.pattern, value))
            ):
                raise ValueError(f"expected {self.expected()}")
            return value
        # JSON clients may send 3.0 for 3; booleans are ints in Python but never a count or a number here
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"expected {self.expected()}")
        if self.kind == "integer":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected {self.expected()}")
            value = int(value)
        else:
            value = float(value)
        exempt = self.unbounded_for_policy is not None and policy == self.unbounded_for_policy
        if (
            (self.minimum is not None and value < self.minimum)
            or (self.exclusive_minimum is not None and value <= self.exclusive_minimum)
            or (self.maximum is not None and value > self.maximum and not exempt)
        ):
            raise ValueError(f"expected {self.expected()}")
        return value

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema ``vscode-client/package.json`` must give ``dice.<key>`` (descriptions aside)."""
        default = list(self.default) if isinstance(self.default, tuple) else self.default
        schema: dict[str, Any] = {"type": self.kind, "default": default}
        if self.kind == "array":
            schema["items"] = {"type": "string"}
        if self.choices:  # a pattern (device "cuda:N") is accepted too, but the editor offers the choices
            schema["enum"] = list(self.choices)
        for name, value in (("minimum", self.minimum), ("exclusiveMinimum", self.exclusive_minimum)):
            if value is not None:
                schema[name] = value
        if self.maximum is not None and self.unbounded_for_policy is None:
            schema["maximum"] = self.maximum
        return schema


def _num(x: float | None) -> str:
    return f"{x:g}" if x is not None else ""


SETTINGS: tuple[Setting, ...] = (
    Setting("model_path", "modelPath", "string", ""),  # "" = $DICE_MODEL, else the embedded model
    Setting("device", "device", "string", "auto", choices=DEVICES, pattern=r"cuda:[0-9]+"),
    Setting("candidates", "candidates", "integer", 3, minimum=1, maximum=64),
    Setting("block_size", "blockSize", "integer", 4, minimum=1, maximum=64),
    Setting("steps_per_block", "stepsPerBlock", "integer", 4, minimum=1, maximum=64),
    Setting("policy", "policy", "string", "dynamic", choices=POLICIES),
    Setting(
        "threshold",
        "threshold",
        "number",
        0.9,
        exclusive_minimum=0.0,
        maximum=1.0,
        unbounded_for_policy="entropy",
    ),
    Setting("max_latency_ms", "maxLatencyMs", "integer", 2000, minimum=50, maximum=600_000),
    Setting("automatic_trigger", "automaticTrigger", "boolean", True, assistant=False),
    Setting("validation_level", "validationLevel", "string", "run", choices=VALIDATION_LEVELS),
    Setting("max_new_tokens", "maxNewTokens", "integer", 256, minimum=1, maximum=32768),
    # how the compile check finds the project's flags: an explicit compile_commands.json ("" = look for one
    # beside the file, in an ancestor, or in a build*/ folder of an ancestor), extra -I folders and -D macros
    Setting("compile_commands", "compileCommands", "string", ""),
    Setting("include_paths", "includePaths", "array", ()),
    Setting("defines", "defines", "array", ()),
    # when no candidate passes validation, still show the best one, marked with its verdict
    Setting("show_failing_suggestions", "showFailingSuggestions", "boolean", True, assistant=False),
    # run the workspace's code (dice-spec blocks, KernelBench references and candidates): off, validation is
    # compile-only (rules.code_run_refusal); VS Code sends its own workspace trust instead. The CLI sets it.
    Setting("trusted_workspace", "trustedWorkspace", "boolean", False),
    # "" = $DICE_SERVER, else the model runs in this process. Editor key dice.modelServer: VS Code already has
    # dice.server.command / .pythonPath (how the language server is started) under dice.server. The API key is
    # never a setting (settings files are shared): $DICE_SERVER_API_KEY, filled by VS Code from its secrets
    Setting("server", "modelServer", "string", ""),
    Setting("server_model", "modelServerModel", "string", ""),
    Setting("sample_temperature", None, "number", 0.8, exclusive_minimum=0.0),
    Setting("seed", None, "integer", 0),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS if s.key is not None}
EDITOR_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.key is not None)


def _default(name: str) -> Any:
    return BY_NAME[name].default


@dataclass(frozen=True)
class AssistantSettings:
    """What the user can configure (``SETTINGS`` holds each field's default and bounds).

    ``trusted_workspace`` False (the default) validates compile-only: nothing the file's folder wrote is run
    (``rules.code_run_refusal``).

    ``model_path`` None (or "") means ``$DICE_MODEL``, else the embedded model. ``max_latency_ms`` <= 0
    means no latency budget: the command line's default, and allowed only here (the editor's minimum is
    in ``SETTINGS``). Candidate 0 of every mask is greedy; the others are sampled at ``sample_temperature``
    from ``seed``, so a request is reproducible (and therefore cacheable). Bad values raise ``ValueError``
    naming every bad field.
    """

    model_path: str | None = None
    device: str = _default("device")
    candidates: int = _default("candidates")
    block_size: int = _default("block_size")
    steps_per_block: int = _default("steps_per_block")
    policy: str = _default("policy")
    threshold: float = _default("threshold")
    max_latency_ms: int = _default("max_latency_ms")
    validation_level: ValidationLevel = _default("validation_level")
    max_new_tokens: int = _default("max_new_tokens")
    compile_commands: str = _default("compile_commands")
    include_paths: tuple[str, ...] = _default("include_paths")
    defines: tuple[str, ...] = _default("defines")
    trusted_workspace: bool = _default("trusted_workspace")
    server: str = _default("server")
    server_model: str = _default("server_model")
    sample_temperature: float = _default("sample_temperature")
    seed: int = _default("seed")

    def __post_init__(self) -> None:
        problems = []
        for setting in SETTINGS:
            if not setting.assistant:
                continue
            value = getattr(self, setting.name)
            if setting.name == "model_path" and value is None:
                continue
            if setting.name == "max_latency_ms":
                # any budget here (<= 0: none, the command line's default); the editor's bounds in SETTINGS
                # keep an editor from asking for a budget no suggestion fits in
                if isinstance(value, bool) or not isinstance(value, int):
                    problems.append(f"max_latency_ms must be an integer, got {value!r}")
                continue
            try:
                cleaned = setting.check(value, policy=self.policy)
            except ValueError as exc:
                problems.append(f"{setting.name} must be {str(exc).removeprefix('expected ')}, got {value!r}")
                continue
            if setting.kind == "array":  # lists (JSON, argparse) become tuples: the object stays hashable
                object.__setattr__(self, setting.name, cleaned)
        if problems:
            raise ValueError("; ".join(problems))

    def replace(self, **changes: Any) -> AssistantSettings:
        return dataclasses.replace(self, **changes)

    def build_key(self) -> tuple[Any, ...]:
        """The settings that change how the compile check builds the file (part of verdict cache keys)."""
        return (self.compile_commands, self.include_paths, self.defines)

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
class ParsedEditorSettings:
    """The editor's ``dice`` object read against ``SETTINGS``: every editor setting's value (bad or missing
    ones at their default), what was wrong, and keys this table does not know."""

    values: dict[str, Any]  # by Python name
    problems: list[str]  # one line per bad value, each replaced by its default: shown to the user
    unknown: list[str]  # keys no setting has (client-only settings): logged only

    def assistant_settings(self) -> AssistantSettings:
        kwargs = {s.name: self.values[s.name] for s in EDITOR_SETTINGS if s.assistant}
        kwargs["model_path"] = kwargs["model_path"] or None
        return AssistantSettings(**kwargs)


def parse_editor_settings(raw: Any) -> ParsedEditorSettings:
    """Read the editor's flat camelCase ``dice`` object (or ``{"dice": {...}}``, or None); never raises.

    A missing or null key takes its default; a bad value is reported and replaced by its default; a
    threshold above 1 is checked against the policy that ends up in effect.
    """
    values = {s.name: s.default for s in EDITOR_SETTINGS}
    problems: list[str] = []
    unknown: list[str] = []
    if isinstance(raw, Mapping) and isinstance(raw.get("dice"), Mapping) and set(raw) == {"dice"}:
        raw = raw["dice"]
    if raw is None:
        return ParsedEditorSettings(values, problems, unknown)
    if not isinstance(raw, Mapping):
        problem = f"dice settings: expected an object, got {type(raw).__name__}; using the defaults"
        return ParsedEditorSettings(values, [problem], unknown)
    policy_value = raw.get("policy")
    policy = policy_value if policy_value in POLICIES else values["policy"]
    for key, value in raw.items():
        setting = BY_KEY.get(key) if isinstance(key, str) else None
        if setting is None:
            unknown.append(str(key))
            continue
        if value is None:
            continue
        try:
            values[setting.name] = setting.check(value, policy=policy)
        except ValueError as exc:
            problems.append(f"dice.{key}: {exc}, got {value!r}; using the default {setting.default!r}")
    return ParsedEditorSettings(values, problems, unknown)


def editor_settings_to_wire(values: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`parse_editor_settings`: the flat camelCase ``dice`` object."""
    return {s.key: values[s.name] for s in EDITOR_SETTINGS if s.key is not None}
