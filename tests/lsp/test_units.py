"""The pure modules behind the handlers: settings parsing, verdict labels, debounce, reference discovery,
KernelBench detection, command arguments (no server process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dice.assistant.rules import usable as is_usable
from dice.validator.spec_files import spec_reference_files
from dice.validator.verdict import verdict_label
from lsp_server.actions import CommandArgumentError, parse_arguments
from lsp_server.config import DiceSettings, parse_settings, settings_to_wire
from lsp_server.inline import AdaptiveDebounce, RequestTracker, Shown
from lsp_server.kernelbench import is_generation_target, output_path

from .conftest import KERNELBENCH_REF


def test_settings_defaults_round_trip_and_strictness() -> None:
    defaults = DiceSettings()
    assert parse_settings(settings_to_wire(defaults)).settings == defaults
    assert parse_settings(None).settings == defaults
    parsed = parse_settings(
        {"dice": {"candidates": 5.0, "threshold": 1, "blockSize": True, "device": "cuda"}}
    )
    assert parsed.settings.decoding.candidates == 5  # 5.0 is an integer
    assert parsed.settings.decoding.threshold == 1.0
    assert parsed.settings.decoding.block_size == 4  # true is not a count
    assert parsed.settings.model.device == "cuda"
    assert parsed.problems == [
        "dice.blockSize: expected an integer in [1, 64], got True; using the default 4"
    ]
    assert parse_settings({"modelPath": None}).settings.model.path == ""  # null = default, no complaint
    assert parse_settings({"modelPath": None}).problems == []
    assert DiceSettings().to_assistant_kwargs()["model_path"] is None  # "" = embedded


@pytest.mark.parametrize(
    ("verdict", "label"),
    [
        (
            {"status": "correct", "compiled": True, "correct": True, "speedup": 2.34},
            "compiled ✓ · correct ✓ · 2.34× vs PyTorch",
        ),
        ({"status": "correct", "compiled": True, "correct": True, "speedup": None}, "compiled ✓ · correct ✓"),
        (
            {"status": "incorrect", "compiled": True, "max_abs_err": 0.5},
            "compiled ✓ · correct ✗ (max abs err 0.5)",
        ),
        ({"status": "compiled", "compiled": True}, "compiled ✓ · not run"),
        ({"status": "compile_error", "compiled": False}, "compiled ✗"),
        ({"status": "runtime_error", "compiled": True}, "compiled ✓ · runtime error"),
        ({"status": "timeout", "compiled": True}, "compiled ✓ · timed out"),
        ({"status": "timeout", "compiled": False}, "timed out"),
        ({"status": "runtime_error", "compiled": False}, "runtime error"),
        (
            {"status": "compiled", "compiled": True, "flags": ["not_run", "speedup_over_10x"]},
            "compiled ✓ · not run · flags: speedup_over_10x",
        ),
        ({"status": "rejected", "compiled": True, "message": "torch fallback"}, "rejected: torch fallback"),
        (None, "not validated"),
    ],
)
def test_verdict_labels(verdict: dict | None, label: str) -> None:
    assert verdict_label(verdict) == label


def test_usable_fills() -> None:
    assert is_usable(None, "none")
    assert not is_usable(None, "compile")
    assert is_usable({"status": "compiled", "compiled": True}, "compile")
    assert not is_usable({"status": "compile_error", "compiled": False}, "run")
    assert not is_usable({"status": "incorrect", "compiled": True}, "run")
    # a candidate that crashed or hung against the spec compiled, but is not shown (nor written by the CLI)
    assert not is_usable({"status": "runtime_error", "compiled": True}, "run")
    assert not is_usable({"status": "timeout", "compiled": True}, "run")
    assert not is_usable({"status": "rejected", "compiled": True}, "run")
    assert is_usable({"status": "correct", "compiled": True}, "run")


def test_adaptive_debounce_follows_typing() -> None:
    d = AdaptiveDebounce(min_s=0.05, max_s=0.6)
    assert d.delay("u", now=0.0) == 0.05  # nothing known yet
    for t in (0.0, 0.1, 0.2, 0.3):
        d.record_edit("u", now=t)
    assert d.delay("u", now=0.35) == pytest.approx(0.15)  # 1.5 x the 100 ms rhythm
    for t in (1.0, 1.5, 2.0, 2.5):
        d.record_edit("slow", now=t)
    assert d.delay("slow", now=2.55) == 0.6  # clamped
    assert d.delay("slow", now=10.0) == 0.05  # the user paused: answer now


async def test_request_tracker_cancels_the_older_request() -> None:
    tracker = RequestTracker()
    older = tracker.start("u")
    newer = tracker.start("u")
    other = tracker.start("v")
    assert older.cancel.is_set() and not tracker.is_live(older)
    assert tracker.is_live(newer) and tracker.is_live(other)
    tracker.finish(older)  # finishing a superseded request leaves the newer one live
    assert tracker.is_live(newer)


def test_spec_reference_files(tmp_path: Path) -> None:
    (tmp_path / "ref_mod.py").write_text("")
    (tmp_path / "data.py").write_text("")
    spec = "import torch\nimport numpy as np\nfrom ref_mod import reference\nX = open('data.py')\n"
    cu = tmp_path / "k.cu"
    found = spec_reference_files(spec, cu)
    # torch/numpy are not files beside k.cu; the KernelBench sibling k.py is watched even before it exists
    assert found == {
        (tmp_path / "ref_mod.py").resolve(),
        (tmp_path / "data.py").resolve(),
        (tmp_path / "k.py").resolve(),
    }
    assert spec_reference_files("def broken(:\n", cu) == {(tmp_path / "k.py").resolve()}


def test_kernelbench_detection_and_output_path(tmp_path: Path) -> None:
    assert is_generation_target(KERNELBENCH_REF)
    assert not is_generation_target(KERNELBENCH_REF + "\nclass ModelNew(Model):\n    pass\n")
    assert not is_generation_target("def broken(:")
    # no get_init_inputs: generation would refuse it, so the action is not offered (one rule for both)
    assert not is_generation_target(KERNELBENCH_REF.replace("def get_init_inputs", "def init_inputs"))
    ref = tmp_path / "add.py"
    assert output_path(ref) == tmp_path / "add_dice.py"
    (tmp_path / "add_dice.py").write_text("")
    assert output_path(ref) == tmp_path / "add_dice_2.py"  # never overwrites


def test_command_arguments() -> None:
    assert parse_arguments("dice.fillAllMasks", ["file:///a.cu"]).uri == "file:///a.cu"
    assert parse_arguments("dice.fillAllMasks", [{"uri": "file:///a.cu"}]).uri == "file:///a.cu"
    target = parse_arguments("dice.fillMask", ["file:///a.cu", {"line": 3, "character": 7}])
    assert (target.position.line, target.position.character) == (3, 7)
    for bad in ([], [None], ["file:///a.cu"], ["file:///a.cu", {"line": "3", "character": 0}]):
        with pytest.raises(CommandArgumentError):
            parse_arguments("dice.fillMask", bad)


def test_typing_through_shown_suggestions() -> None:
    doc = b"__global__ void k(float* y) {\n    \n}\n"
    cursor = doc.index(b"    \n") + 4
    shown = Shown.at(doc, cursor, ["y[0] = 1.0f;", "y[0] = 2.0f;", "return;"], ["v1", "v2", "v3"])

    def typed(text: str, *, before: bytes = b"", after: bytes = b"") -> object:
        data = before + doc[:cursor] + text.encode() + doc[cursor:] + after
        return shown.typed_through(data, len(before) + cursor + len(text.encode()))

    assert typed("y[0] = ") == ("y[0] = ", ["1.0f;", "2.0f;"], ["v1", "v2"])
    assert typed("y[0] = 2") == ("y[0] = 2", [".0f;"], ["v2"])
    assert typed("r") == ("r", ["eturn;"], ["v3"])
    assert typed("") is None  # nothing typed: the assistant's own cache answers that
    assert typed("x") is None  # not what was shown
    assert typed("return;") is None  # all of it typed: nothing left to show
    assert typed("y[0]", before=b"// edited\n") is None  # the text before the suggestion changed
    assert typed("y[0]", after=b"// edited\n") is None  # or the text after the cursor
    assert shown.typed_through(doc, cursor - 1) is None  # the cursor moved back
    multibyte = Shown.at(doc, cursor, ["é = 1;"], [None])
    data = doc[:cursor] + "é".encode() + doc[cursor:]
    assert multibyte.typed_through(data, cursor + 1) is None  # inside a character
    assert multibyte.typed_through(data, cursor + 2) == ("é", [" = 1;"], [None])
