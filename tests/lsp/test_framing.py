"""The base protocol's framing (lsp_server/framing.py): bad headers, lengths that are off, absurd lengths and
bodies that are not JSON cost one message, never the session. The real ``dice-lsp`` is driven with raw bytes
on its stdin (and one TCP socket); MessageFramer's rules are also checked on their own, byte by byte."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest

from lsp_server.framing import Dropped, Message, MessageFramer, ParseError, max_message_bytes_from_env

from .conftest import SERVER_COMMAND, WAIT_S, RawServer, free_port, serving


def body_of(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8")


def stats(msg_id: int, **params: Any) -> dict[str, Any]:
    """``dice/stats`` answers without a model: a request that shows whether the server still listens."""
    return {"jsonrpc": "2.0", "id": msg_id, "method": "dice/stats", "params": params or None}


def framed(body: bytes, header: bytes | None = None) -> bytes:
    return (header if header is not None else b"Content-Length: %d\r\n" % len(body)) + b"\r\n" + body


class Client(RawServer):
    """RawServer that writes arbitrary bytes and keeps every message the server sent."""

    seen: list[dict[str, Any]]

    @classmethod
    async def launch(cls, env: dict[str, str] | None = None) -> Client:
        proc = await asyncio.create_subprocess_exec(
            *SERVER_COMMAND,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        client = cls(proc)
        client.seen = []
        return client

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)

    async def response(self, msg_id: Any) -> dict[str, Any]:
        """The response to ``msg_id``, whether it came already (while waiting for another) or comes now."""
        while True:
            for message in self.seen:
                if message.get("id") == msg_id and "method" not in message:
                    return message
            self.seen.append(await self.read())

    def logged(self) -> list[str]:
        return [m["params"]["message"] for m in self.seen if m.get("method") == "window/logMessage"]

    async def stop(self) -> int:
        self.send({"jsonrpc": "2.0", "id": "bye", "method": "shutdown"})
        assert (await self.response("bye"))["result"] is None
        self.send({"jsonrpc": "2.0", "method": "exit"})
        return await asyncio.wait_for(self.proc.wait(), WAIT_S)


async def started(env: dict[str, str] | None = None) -> Client:
    client = await Client.launch(env)
    await client.initialize({"modelPath": "/nonexistent/dice-model"})
    return client


async def test_header_spellings_are_read() -> None:
    client = await started()
    headers = [
        b"content-length: %d\r\n\r\n",  # lowercase
        b"Content-Length:%d\r\n\r\n",  # no blank after the colon
        b"CONTENT-LENGTH :  %d  \r\n\r\n",  # blanks around the colon and after the value
        b"Content-Length: %d\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n",
        b"Content-Type: application/vscode-jsonrpc\nContent-Length: %d\n\n",  # bare LF line ends
    ]
    for n, header in enumerate(headers, start=1):
        body = body_of(stats(n))
        client.write(header % len(body) + body)
        assert "result" in await client.response(n), header
    assert await client.stop() == 0


@pytest.mark.parametrize(
    "bad_header",
    [
        b"Content-Length: -5",
        b"Content-Length: ten",
        b"Content-Length: 4e9",
        b"Content-Length: 99999999999999",
    ],
)
async def test_bad_lengths_are_dropped_and_the_session_goes_on(bad_header: bytes) -> None:
    client = await started()
    started_at = time.monotonic()
    client.write(framed(body_of(stats(1)), bad_header + b"\r\n") + framed(body_of(stats(2))))
    answer = await client.response(2)
    assert "result" in answer
    assert time.monotonic() - started_at < 10  # 4e9 / 99999999999999: no wait for gigabytes, no MemoryError
    assert all(m.get("id") != 1 for m in client.seen)  # the message with the bad length is dropped
    assert any("dropped" in text and "Content-Length" in text for text in client.logged())
    assert await client.stop() == 0


async def test_lengths_that_are_off_recover_both_messages() -> None:
    client = await started()
    body = body_of(stats(1))
    # two bytes too many: they are the next header's first bytes
    client.write(framed(body, b"Content-Length: %d\r\n" % (len(body) + 2)) + framed(body_of(stats(2))))
    assert "result" in await client.response(1)
    assert "result" in await client.response(2)
    # two bytes too few: the body's end is glued to the next header
    body = body_of(stats(3))
    client.write(framed(body, b"Content-Length: %d\r\n" % (len(body) - 2)) + framed(body_of(stats(4))))
    assert "result" in await client.response(3)
    assert "result" in await client.response(4)
    assert await client.stop() == 0


async def test_a_client_counting_characters_instead_of_bytes(tmp_path) -> None:
    client = await started()
    text = "// é𝄞 non-ASCII before the mask\n__global__ void k(float* y) {\n    /* <MASK> */\n}\n"
    uri = (tmp_path / "chars.cu").as_uri()
    did_open = {
        "jsonrpc": "2.0",
        "method": "textDocument/didOpen",
        "params": {"textDocument": {"uri": uri, "languageId": "cuda-cpp", "version": 1, "text": text}},
    }
    action = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "textDocument/codeAction",
        "params": {
            "textDocument": {"uri": uri},
            "range": {"start": {"line": 2, "character": 6}, "end": {"line": 2, "character": 6}},
            "context": {"diagnostics": []},
        },
    }
    for message in (did_open, action):
        as_text = json.dumps(message, ensure_ascii=False)
        # the length in characters: 3 fewer than the UTF-8 bytes for é and 𝄞 ... each time
        client.write(b"Content-Length: %d\r\n\r\n" % len(as_text) + as_text.encode("utf-8"))
    answer = await client.response(7)
    assert [a["title"] for a in answer["result"]][:1] == ["DICE: Fill this mask"], answer
    assert await client.stop() == 0


async def test_bodies_that_are_not_json_get_a_parse_error() -> None:
    client = await started()
    client.write(framed(b"{not json"))
    client.write(framed(b'{"jsonrpc": "2.0", "id": 1, "method": "dice/stats", "params": "\xff\xfe"}'))
    client.write(framed(b"[]"))
    client.write(framed(body_of(stats(2))))
    assert "result" in await client.response(2)
    errors = [(m["error"]["code"], m["id"], m["error"]["message"]) for m in client.seen if "error" in m]
    assert [(code, msg_id) for code, msg_id, _ in errors] == [(-32700, None), (-32700, None), (-32600, None)]
    assert "UTF-8" in errors[1][2]
    assert await client.stop() == 0


async def test_the_message_size_limit_is_configurable() -> None:
    client = await started({"DICE_LSP_MAX_MESSAGE_BYTES": "2000"})
    big = body_of(stats(1, padding="x" * 5000))
    client.write(framed(big) + framed(body_of(stats(2))))
    assert "result" in await client.response(2)
    assert all(m.get("id") != 1 for m in client.seen)
    assert any("2000-byte message limit" in text for text in client.logged())
    assert await client.stop() == 0


async def test_tcp_reads_with_the_same_framing(tmp_path) -> None:
    port = free_port()
    async with serving("--tcp", f"127.0.0.1:{port}", env={"DICE_LSP_TOKEN": "tcp-test-token"}) as proc:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = Client.__new__(Client)
        client.proc = type("Pipe", (), {"stdin": writer, "stdout": reader})()
        client.seen = []
        await client.initialize({"modelPath": str(tmp_path / "none"), "token": "tcp-test-token"})
        client.write(framed(body_of(stats(1)), b"Content-Length: nope\r\n") + framed(body_of(stats(2))))
        body = body_of(stats(3))
        client.write(framed(body, b"content-length:%d\r\n" % len(body)))
        assert "result" in await client.response(2)
        assert "result" in await client.response(3)
        client.send({"jsonrpc": "2.0", "id": 4, "method": "shutdown"})
        await client.response(4)
        client.send({"jsonrpc": "2.0", "method": "exit"})
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0


# ---------------------------------------------------------------------------------------------- the framer


def feed_bytewise(framer: MessageFramer, data: bytes) -> list:
    events = []
    for i in range(len(data)):
        events += framer.feed(data[i : i + 1])
    return events


def test_framer_reads_messages_split_anywhere() -> None:
    messages = [stats(1), stats(2, text="é𝄞\r\n")]
    data = b"".join(framed(body_of(m)) for m in messages)
    assert feed_bytewise(MessageFramer(), data) == [Message(m) for m in messages]


def test_framer_drops_an_absurd_body_without_keeping_it() -> None:
    framer = MessageFramer(max_message_bytes=1000)
    events = framer.feed(b"Content-Length: 99999999999999\r\n\r\n")
    assert events == [Dropped("Content-Length '99999999999999' is over the 1000-byte message limit")]
    chunk = b'{"text": "' + b"x" * 65536
    for _ in range(160):  # 10 MB of a body that will never be read
        assert framer.feed(chunk) == []
        assert framer.buffered < 70_000
    assert framer.feed(b'"}' + framed(body_of(stats(5)))) == [Message(stats(5))]


def test_framer_parse_errors_and_recovery() -> None:
    framer = MessageFramer()
    assert framer.feed(framed(b"{not json")) == [ParseError("the message body is not JSON: " + _json_error())]
    assert framer.feed(framed(b'{"a": "\xff"}')) == [ParseError("the message body is not valid UTF-8")]
    garbage = b"garbage line\r\n\x00\x01 binary\r\n"
    events = framer.feed(garbage + framed(body_of(stats(1))))
    assert events[0] == Dropped("dropped 12 bytes that are not a header") and events[1:] == [
        Message(stats(1))
    ]


def test_max_message_bytes_setting() -> None:
    assert max_message_bytes_from_env({}) == 64 * 1024 * 1024
    assert max_message_bytes_from_env({"DICE_LSP_MAX_MESSAGE_BYTES": "4096"}) == 4096
    assert max_message_bytes_from_env({"DICE_LSP_MAX_MESSAGE_BYTES": "-1"}) == 64 * 1024 * 1024


def _json_error() -> str:
    try:
        json.loads("{not json")
    except ValueError as exc:
        return str(exc)
    raise AssertionError("unreachable")
