"""The settings table (dice.assistant.settings.SETTINGS) is the one copy of the settings' names, defaults,
bounds and choices: the VS Code schema, the TypeScript defaults, the language server's sections and the
command line's defaults are all checked against it here, so a setting can no longer drift."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dice.assistant.settings import (
    BY_NAME,
    EDITOR_SETTINGS,
    SETTINGS,
    AssistantSettings,
    parse_editor_settings,
)

CLIENT = Path(__file__).resolve().parents[1] / "vscode-client"
SCHEMA_KEYS = (
    "type",
    "default",
    "enum",
    "items",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
)


def package_properties() -> dict[str, dict]:
    package = json.loads((CLIENT / "package.json").read_text(encoding="utf-8"))
    return package["contributes"]["configuration"]["properties"]


@pytest.mark.parametrize("setting", EDITOR_SETTINGS, ids=lambda s: s.key)
def test_package_json_schema_is_the_tables(setting) -> None:
    prop = package_properties()[f"dice.{setting.key}"]
    schema = {k: v for k, v in prop.items() if k in SCHEMA_KEYS}
    assert schema == setting.json_schema()
    assert prop.get("description") or prop.get("markdownDescription")


def test_package_json_has_no_server_setting_the_table_lacks() -> None:
    client_only = {"dice.server.command", "dice.server.pythonPath", "dice.trace.server"}
    assert set(package_properties()) - client_only == {f"dice.{s.key}" for s in EDITOR_SETTINGS}


def test_typescript_defaults_and_keys_are_the_tables() -> None:
    source = (CLIENT / "src" / "common" / "protocol.ts").read_text(encoding="utf-8")
    literal = re.search(r"DEFAULT_SERVER_SETTINGS[^=]*=\s*Object\.freeze\(\{(.*?)\}\)", source, re.DOTALL)
    assert literal, "DEFAULT_SERVER_SETTINGS not found in protocol.ts"
    defaults = {}
    for key, value in re.findall(r"(\w+):\s*([^,\n]+),", literal.group(1)):
        defaults[key] = json.loads(value.strip().replace("'", '"'))
    assert defaults == {s.key: list(s.default) if s.kind == "array" else s.default for s in EDITOR_SETTINGS}
    interface = re.search(r"interface DiceServerSettings \{(.*?)\}", source, re.DOTALL)
    assert interface
    assert re.findall(r"^\s*(\w+):", interface.group(1), re.MULTILINE) == [s.key for s in EDITOR_SETTINGS]


def test_typescript_checks_name_the_tables_bounds() -> None:
    """settings.ts checks each value as the schema does (the TypeScript test ties it to package.json);
    here its integer bounds are read back and compared with the table."""
    source = (CLIENT / "src" / "common" / "settings.ts").read_text(encoding="utf-8")
    for setting in EDITOR_SETTINGS:
        if setting.kind != "integer":
            continue
        found = re.search(rf"{setting.key}: \[integerIn\(([\d_]+), ([\d_]+)\)", source)
        assert found, setting.key
        assert (int(found.group(1)), int(found.group(2))) == (setting.minimum, setting.maximum)
    assert "threshold: [numberAbove(0)" in source


def test_language_server_sections_cover_the_table() -> None:
    from lsp_server.config import SECTIONS, DiceSettings

    assert set(SECTIONS) == {s.name for s in EDITOR_SETTINGS}
    values = DiceSettings().values()
    assert values == {s.name: s.default for s in EDITOR_SETTINGS}


def test_command_line_defaults_are_the_tables() -> None:
    from dice.cli import build_parser

    args = build_parser().parse_args(["complete", "x.cu"])
    flags = {
        "device": args.device,
        "block_size": args.block_size,
        "steps_per_block": args.steps_per_block,
        "policy": args.policy,
        "threshold": args.threshold,
        "validation_level": args.validation,
        "max_new_tokens": args.max_new_tokens,
        "sample_temperature": args.temperature,
        "seed": args.seed,
    }
    assert flags == {name: BY_NAME[name].default for name in flags}
    assert AssistantSettings() == AssistantSettings(
        **{s.name: s.default for s in SETTINGS if s.assistant} | {"model_path": None}
    )


# ------------------------------------------------------------- the disagreements the one table removed
def test_threshold_zero_is_refused_by_the_editor_settings_and_the_assistant_alike() -> None:
    """It passed the editor's check ([0, 1]) and then failed in AssistantSettings ((0, 1]), which the
    editor reported as "cannot load the model"."""
    parsed = parse_editor_settings({"threshold": 0})
    assert parsed.problems and "dice.threshold" in parsed.problems[0]
    assert parsed.assistant_settings().threshold == BY_NAME["threshold"].default
    with pytest.raises(ValueError, match="threshold"):
        AssistantSettings(threshold=0.0)


def test_an_entropy_budget_above_one_is_accepted_everywhere_and_a_confidence_above_one_nowhere() -> None:
    assert parse_editor_settings({"policy": "entropy", "threshold": 2.5}).problems == []
    assert AssistantSettings(policy="entropy", threshold=2.5).threshold == 2.5
    assert parse_editor_settings({"policy": "dynamic", "threshold": 1.5}).problems
    with pytest.raises(ValueError):
        AssistantSettings(policy="dynamic", threshold=1.5)


def test_every_editor_value_the_table_accepts_makes_valid_assistant_settings() -> None:
    for setting in EDITOR_SETTINGS:
        edges = [setting.default, *setting.choices]
        edges += [v for v in (setting.minimum, setting.maximum) if v is not None]
        for value in edges:
            parsed = parse_editor_settings({setting.key: value})
            assert parsed.problems == [], (setting.key, value)
            parsed.assistant_settings()  # never raises for a value the editor accepted
