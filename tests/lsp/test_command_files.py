"""Commands on files the editor has not opened: a FIFO, a device, a folder or a huge file is refused with a
message, off the event loop (the server keeps answering meanwhile); the direct-write fallback of "Generate
CUDA kernel" never clobbers a file; command results are strict JSON (``dice.safeio``)."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import init_params, server_config, server_stats, wait_status

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(os.name != "posix", reason="FIFOs and devices are POSIX"),
]

REFUSED_IN_S = 10.0  # a refusal takes milliseconds; a blocked event loop never answers


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    # no model: these commands are refused before any model or validator work
    missing = tmp_path_factory.mktemp("none") / "no-model"
    await lsp_client.initialize_session(init_params({"modelPath": str(missing)}))
    await wait_status(lsp_client, "error")
    yield
    await lsp_client.shutdown_session()


def command(name: str, *arguments: object) -> types.ExecuteCommandParams:
    return types.ExecuteCommandParams(command=name, arguments=list(arguments))


@pytest.mark.parametrize("name", ["dice.validateKernel", "dice.fillAllMasks", "dice.generateKernel"])
async def test_a_fifo_is_refused_while_the_server_keeps_answering(
    client: LanguageClient, tmp_path: Path, name: str
) -> None:
    fifo = tmp_path / ("pipe.py" if name == "dice.generateKernel" else "pipe.cu")
    os.mkfifo(fifo)
    # a writer holds the FIFO open and never writes: a reader of it would wait for data forever
    holder = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        pending = asyncio.ensure_future(client.workspace_execute_command_async(command(name, fifo.as_uri())))
        stats = await asyncio.wait_for(server_stats(client), REFUSED_IN_S)  # a second request, answered
        assert stats["engine_calls"] == 0
        result = await asyncio.wait_for(pending, REFUSED_IN_S)
    finally:
        os.close(holder)  # the FIFO's only writer goes: a reader blocked in it (a regression) gets EOF
    assert result == {
        "ok": False,
        "message": f"cannot read {fifo}: is a named pipe (FIFO), not a regular file (DICE reads regular "
        "files only)",
    }
    assert any(str(fifo) in m.message for m in client.messages)  # shown to the user too


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
async def test_dev_zero_a_folder_and_a_huge_file_are_refused(client: LanguageClient, tmp_path: Path) -> None:
    huge = tmp_path / "huge.cu"
    with huge.open("wb") as f:
        f.truncate(3 * 1024**3)  # sparse: reading it would take 3 GiB
    expected = {
        Path("/dev/zero"): "is a character device, not a regular file (DICE reads regular files only)",
        tmp_path: "is a folder, not a file",
        huge: "the document is too large: 3 GiB (3221225472 bytes), over the 32 MiB limit",
    }
    for path, why in expected.items():
        result = await asyncio.wait_for(
            client.workspace_execute_command_async(command("dice.validateKernel", path.as_uri())),
            REFUSED_IN_S,
        )
        assert result == {"ok": False, "message": f"cannot read {path}: {why}"}
    assert (await server_stats(client))["validations"] == 0


# ------------------------------------------------------------------------------ in process, no editor


def _session_without_create_file() -> Any:
    """What ``_create_file`` reads of a session whose client cannot create files (no workspace caps)."""
    logged: list[str] = []
    ls = SimpleNamespace(client_capabilities=SimpleNamespace(workspace=None))
    return SimpleNamespace(ls=ls, log=logged.append, logged=logged)


async def test_the_direct_write_fallback_uses_no_fixed_temporary_name(tmp_path: Path) -> None:
    from lsp_server.commands import CommandFailed, _create_file

    out = tmp_path / "add_dice.py"
    bystander = tmp_path / "add_dice.py.tmp"  # a user's own file with the name a fixed temporary takes
    bystander.write_text("mine")
    session = _session_without_create_file()
    await _create_file(session, out, out.as_uri(), "program\n")
    assert out.read_text() == "program\n" and bystander.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add_dice.py", "add_dice.py.tmp"]
    # a file that took the name meanwhile is never replaced
    with pytest.raises(CommandFailed, match=r"add_dice\.py: exists; not overwriting it"):
        await _create_file(session, out, out.as_uri(), "other\n")
    assert out.read_text() == "program\n"


async def test_the_direct_write_fallback_reports_a_read_only_folder(tmp_path: Path) -> None:
    from lsp_server.commands import CommandFailed, _create_file

    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(CommandFailed, match="cannot write in its folder"):
            await _create_file(_session_without_create_file(), folder / "k_dice.py", "file:///x", "p\n")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


async def test_command_results_are_strict_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict or figure that is NaN/inf reaches VS Code as null plus ``non_finite`` (JSON.parse rejects
    NaN and Infinity)."""
    from lsp_server import commands

    async def validate(session: Any, target: Any, token: Any) -> dict[str, Any]:
        return {"ok": True, "verdict": {"max_abs_err": math.inf, "speedup": math.nan}, "label": "x"}

    monkeypatch.setattr(commands, "validate_kernel", validate)
    result = await commands.execute(SimpleNamespace(), "dice.validateKernel", ["file:///k.cu"], None)

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    text = json.dumps(result)  # what pygls sends
    assert json.loads(text, parse_constant=refuse)["verdict"] == {
        "max_abs_err": None,
        "speedup": None,
        "non_finite": {"max_abs_err": "Infinity", "speedup": "NaN"},
    }
