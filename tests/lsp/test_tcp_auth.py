"""Only the user drives ``dice-lsp`` over a socket: loopback TCP with a token, or a 0600 Unix socket."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from lsp_server.auth import AuthSetupError, authenticates, load_token, read_token_file

from .conftest import WAIT_S, RawServer, free_port, serving

TOKEN = "s3cret-token-for-the-tests-0123456789"


def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RawServer:
    server = RawServer.__new__(RawServer)
    server.proc = type("Pipe", (), {"stdin": writer, "stdout": reader})()  # type: ignore[assignment]
    return server


async def finish(raw: RawServer, proc: Any) -> None:
    raw.send({"jsonrpc": "2.0", "id": 9, "method": "shutdown"})
    assert (await raw.response(9))["result"] is None
    raw.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0


async def assert_closed_unanswered(reader: asyncio.StreamReader) -> None:
    """The server closes the connection without writing a byte (a reset: it closed with our bytes unread)."""
    try:
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    except ConnectionResetError:
        assert not reader._buffer  # noqa: SLF001 - nothing had arrived before the reset


@pytest.mark.parametrize("token", [None, "wrong-token", ""])
async def test_tcp_client_without_the_right_token_is_disconnected(tmp_path: Path, token: str | None) -> None:
    port = free_port()
    async with serving("--tcp", f"127.0.0.1:{port}", env={"DICE_LSP_TOKEN": TOKEN}) as proc:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        intruder = client(reader, writer)
        options: dict[str, Any] = {"modelPath": str(tmp_path / "none")}
        if token is not None:
            options["token"] = token
        intruder.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"processId": None, "capabilities": {}, "initializationOptions": options},
            }
        )
        intruder.send({"jsonrpc": "2.0", "id": 1, "method": "dice/stats"})
        await assert_closed_unanswered(reader)
        writer.close()
        # the server still serves its user afterwards
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        user = client(reader, writer)
        result = await user.initialize({"modelPath": str(tmp_path / "none"), "token": TOKEN})
        assert "inlineCompletionProvider" in result["result"]["capabilities"]
        await finish(user, proc)


async def test_tcp_first_message_must_be_initialize(tmp_path: Path) -> None:
    port = free_port()
    async with serving("--tcp", f"127.0.0.1:{port}", env={"DICE_LSP_TOKEN": TOKEN}):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # a request carrying the token, but not initialize: still refused, never answered
        client(reader, writer).send(
            {"jsonrpc": "2.0", "id": 1, "method": "dice/stats", "params": {"token": TOKEN}}
        )
        await assert_closed_unanswered(reader)


async def test_tcp_client_with_the_token_works_and_a_second_one_is_refused(tmp_path: Path) -> None:
    port = free_port()
    async with serving("--tcp", f"localhost:{port}", env={"DICE_LSP_TOKEN": TOKEN}) as proc:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        user = client(reader, writer)
        await user.initialize({"modelPath": str(tmp_path / "none"), "token": TOKEN})
        user.send({"jsonrpc": "2.0", "id": 1, "method": "dice/stats", "params": {}})
        assert "result" in await user.response(1)
        other_reader, other_writer = await asyncio.open_connection("127.0.0.1", port)
        client(other_reader, other_writer).send({"jsonrpc": "2.0", "id": 0, "method": "initialize"})
        await assert_closed_unanswered(other_reader)
        await finish(user, proc)


async def test_tcp_generated_token_file(tmp_path: Path) -> None:
    port = free_port()
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    async with serving("--tcp", f"127.0.0.1:{port}", env=env) as proc:
        line = next(x for x in proc.startup_log.splitlines() if "token file:" in x)
        path = Path(line.split("token file:", 1)[1].strip())
        assert path.parent == runtime and stat.S_IMODE(path.stat().st_mode) == 0o600
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        user = client(reader, writer)
        await user.initialize({"token": path.read_text().strip()})
        await finish(user, proc)
    assert not path.exists()  # removed when the server ended


def test_non_loopback_bind_is_refused() -> None:
    import subprocess

    for host in ("0.0.0.0", "192.0.2.7", "example.com"):
        out = subprocess.run(
            [sys.executable, "-m", "lsp_server", "--tcp", f"{host}:4711"],
            capture_output=True,
            text=True,
            env={**os.environ, "DICE_LSP_TOKEN": TOKEN},
            timeout=WAIT_S,
        )
        assert out.returncode == 2, out.stderr
        assert "loopback" in out.stderr and "--allow-remote" in out.stderr


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o644)
    with pytest.raises(AuthSetupError, match="0644"):
        read_token_file(path)
    out = subprocess.run(
        [sys.executable, "-m", "lsp_server", "--tcp", "127.0.0.1:4711", "--token-file", str(path)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DICE_LSP_TOKEN"},
        timeout=WAIT_S,
    )
    assert out.returncode == 2 and "0644" in out.stderr
    path.chmod(0o600)
    assert load_token(str(path), environ={}).value == TOKEN
    assert load_token(str(path), environ={"DICE_LSP_TOKEN": "from-env"}).value == "from-env"
    with pytest.raises(AuthSetupError, match="empty"):
        load_token(None, environ={"DICE_LSP_TOKEN": " "})


def test_handshake_rule() -> None:
    def init(options: Any) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"initializationOptions": options},
        }

    assert authenticates(init({"token": TOKEN}), TOKEN)
    assert not authenticates(init({"token": TOKEN + "x"}), TOKEN)
    assert not authenticates(init({"token": 1}), TOKEN)
    assert not authenticates(init(None), TOKEN)
    assert not authenticates(
        {"method": "initialized", "params": {"initializationOptions": {"token": TOKEN}}}, TOKEN
    )
    assert not authenticates(None, TOKEN)


async def test_unix_socket_is_private_and_needs_no_token(tmp_path: Path) -> None:
    folder = tmp_path / "sock"  # created 0700 by the server
    path = folder / "dice.sock"
    async with serving("--socket", str(path)) as proc:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        reader, writer = await asyncio.open_unix_connection(str(path))
        user = client(reader, writer)
        result = await user.initialize({"modelPath": str(tmp_path / "none")})
        assert "inlineCompletionProvider" in result["result"]["capabilities"]
        await finish(user, proc)
    assert not path.exists()


def test_unix_socket_in_a_shared_folder_is_refused(tmp_path: Path) -> None:
    import subprocess

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "lsp_server", "--socket", str(shared / "dice.sock")],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert out.returncode == 2 and "0755" in out.stderr
