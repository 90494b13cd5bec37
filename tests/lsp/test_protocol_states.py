"""The LSP life cycle (lsp_server/protocol_states.py): before ``initialize`` requests get ServerNotInitialized
(-32002) and notifications are dropped; after ``shutdown`` requests get InvalidRequest (-32600); ``exit``
ends the process with 0 after shutdown and 1 otherwise; no error sent to a client carries a traceback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from lsp_server.framing import Message, dispatch

from .conftest import TWO_MASKS, WAIT_S
from .test_framing import Client, stats

NOT_INITIALIZED, INVALID_REQUEST, INTERNAL_ERROR = -32002, -32600, -32603


def request(msg_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def hover(msg_id: Any, uri: str) -> dict[str, Any]:
    position = {"line": 0, "character": 0}
    return request(msg_id, "textDocument/hover", {"textDocument": {"uri": uri}, "position": position})


async def test_before_initialize(tmp_path) -> None:
    client = await Client.launch()
    uri = (tmp_path / "early.cu").as_uri()
    client.send(hover(1, uri))
    client.send(request(2, "shutdown"))  # pygls accepted it, and then answered nothing at all
    client.send(
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {
                "textDocument": {"uri": uri, "languageId": "cuda-cpp", "version": 1, "text": TWO_MASKS}
            },
        }
    )
    for msg_id in (1, 2):
        error = (await client.response(msg_id))["error"]
        assert error["code"] == NOT_INITIALIZED and "data" not in error, error
    result = await client.initialize({"modelPath": str(tmp_path / "none")})
    assert "capabilities" in result["result"]
    # the notification was dropped: nothing (no "Error in server" message) came before initialize's answer
    # (window/logMessage is allowed while initialize runs: the settings it applied)
    notified = {m["method"] for m in client.seen if "method" in m}
    assert notified <= {"window/logMessage"}, notified
    client.send(request(3, "textDocument/codeAction", _code_action_params(uri)))
    assert (await client.response(3))["result"] == []  # never opened: didOpen before initialize was dropped
    assert await client.stop() == 0


async def test_after_shutdown(tmp_path) -> None:
    client = await Client.launch()
    await client.initialize({"modelPath": str(tmp_path / "none")})
    client.send(request(1, "shutdown"))
    assert (await client.response(1))["result"] is None
    client.send(stats(2))
    client.send(request(3, "shutdown"))  # a second shutdown
    client.send(hover(4, (tmp_path / "late.cu").as_uri()))
    for msg_id in (2, 3, 4):
        error = (await client.response(msg_id))["error"]
        assert error["code"] == INVALID_REQUEST and "data" not in error, error
    client.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(client.proc.wait(), WAIT_S) == 0


async def test_initialize_twice_is_refused(tmp_path) -> None:
    client = await Client.launch()
    await client.initialize({"modelPath": str(tmp_path / "none")})
    client.send(request(1, "initialize", {"processId": None, "rootUri": None, "capabilities": {}}))
    assert (await client.response(1))["error"]["code"] == INVALID_REQUEST
    client.send(stats(2))
    assert "result" in await client.response(2)
    assert await client.stop() == 0


async def test_exit_status(tmp_path) -> None:
    # exit before initialize, and exit without shutdown: 1; after shutdown (Client.stop): 0
    early = await Client.launch()
    early.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(early.proc.wait(), WAIT_S) == 1
    running = await Client.launch()
    await running.initialize({"modelPath": str(tmp_path / "none")})
    running.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(running.proc.wait(), WAIT_S) == 1


class Capture:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def write(self, data: bytes) -> None:
        self.messages.append(json.loads(data.split(b"\r\n\r\n", 1)[1]))

    def close(self) -> None:
        pass


async def test_internal_errors_carry_no_traceback() -> None:
    from lsp_server.server import create_server

    server = create_server()

    @server.feature("dice/test/explode")
    def explode(params: Any) -> None:
        raise ValueError("first line of the failure\nsecond line\n" + "x" * 1000)

    capture = Capture()
    server.protocol.set_writer(capture)
    dispatch(server.protocol, Message(request(1, "initialize", {"processId": None, "capabilities": {}})))
    dispatch(server.protocol, Message(request(2, "dice/test/explode")))
    answer = next(m for m in capture.messages if m.get("id") == 2)
    assert answer["error"] == {"code": INTERNAL_ERROR, "message": "ValueError: first line of the failure"}
    assert "Traceback" not in json.dumps(capture.messages) and "explode" not in json.dumps(capture.messages)
    server.session.close()


def _code_action_params(uri: str) -> dict[str, Any]:
    origin = {"line": 0, "character": 0}
    return {
        "textDocument": {"uri": uri},
        "range": {"start": origin, "end": origin},
        "context": {"diagnostics": []},
    }
