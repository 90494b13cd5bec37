"""The LSP base protocol's framing (``Content-Length: N`` headers, a blank line, N bytes of JSON), read so
that one bad message costs that message and never the session.

Why our own reader: pygls 2.1.1 reads messages in ``pygls.io_.run_async``, a module function that
``JsonRPCServer.start_io``/``start_tcp`` call by name, with its header regex compiled inside it
(``^Content-Length: (\\d+)\\r\\n$``, exact case and spacing) and no option for a limit. One header it does not
match (``content-length``, ``Content-Length:10``, ``-5``) leaves it waiting for a length that never comes,
and a length that is off glues every later header to leftover bytes: the server is alive but deaf. A huge
length is passed to ``read(n)`` as is (``99999999999999``: MemoryError; ``4e9``: it waits for 4 GB). None of
this can be configured, so ``dice-lsp`` reads every transport with this module (stdio: ``serve_stdio``,
called by ``DiceLanguageServer.start_io``; TCP and Unix sockets: :mod:`lsp_server.auth`, which adds the
token handshake) and hands each decoded message to
pygls's protocol exactly as ``run_async`` does (``structure_message``, then ``handle_message``).

What :class:`MessageFramer` accepts and how it recovers:

- ``Content-Length`` in any case, blanks around the colon, ``\\r\\n`` or a bare ``\\n`` line ends; other
  headers (``Content-Type``) are ignored. The last ``Content-Length`` before the blank line wins.
- A length that is not a decimal number, or over ``max_message_bytes`` (default 64 MiB,
  ``$DICE_LSP_MAX_MESSAGE_BYTES``): reported, and the bytes that follow are dropped as they arrive (never
  buffered) until the next valid ``Content-Length`` header.
- Bytes before a header (the rest of a body whose length was too short) are dropped up to the header;
  JSON cannot hold a raw line break inside a string, so a line ending in ``Content-Length: N`` is a header.
- A body that is not JSON: when its length was too long, the JSON value it starts with is the message and
  the extra bytes go back to the stream (they are the next header's start); when too short (a client that
  counts characters instead of UTF-8 bytes), the bytes already received up to the next header complete it.
  Otherwise the body gets a JSON-RPC ParseError (-32700, ``"id": null``) and reading goes on. (A length too
  long is noticed when the next message's bytes arrive: until then the reader waits for the missing ones.)

Dropped input is logged and, once the session is initialized, told to the client as a ``window/logMessage``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.server import JsonRPCServer

logger = logging.getLogger(__name__)
# __main__ turns this logger on for --tcp: "Serving on HOST:PORT" tells users and tests the socket is up.
serving_logger = logging.getLogger("pygls.server")

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_MESSAGE_ENV = "DICE_LSP_MAX_MESSAGE_BYTES"
READ_CHUNK = 64 * 1024
MAX_HEADER_LINE = 4096  # a longer line without a line break is not a header: dropped as it arrives
_KEEP_WHILE_DROPPING = 256  # the tail kept of dropped bytes: a header may have begun in it

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

_HEADER_NAME = re.compile(rb"[A-Za-z][A-Za-z0-9-]*[ \t]*:")
_CONTENT_LENGTH_AT_END = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\Z", re.IGNORECASE)
_CONTENT_LENGTH_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)


@dataclass(frozen=True)
class Message:
    """A decoded JSON value (a message object, or something the dispatcher refuses)."""

    value: Any


@dataclass(frozen=True)
class ParseError:
    """A body that is not UTF-8 JSON: answered with -32700."""

    reason: str


@dataclass(frozen=True)
class Dropped:
    """Bytes skipped to find the next header: logged, and told to the client as a log message."""

    reason: str


Event = Message | ParseError | Dropped


def max_message_bytes_from_env(environ: dict[str, str] | None = None) -> int:
    """``$DICE_LSP_MAX_MESSAGE_BYTES`` (a positive integer), else 64 MiB."""
    raw = (environ if environ is not None else os.environ).get(MAX_MESSAGE_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_MESSAGE_BYTES
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    logger.warning(
        "%s=%r is not a positive integer: using %d", MAX_MESSAGE_ENV, raw, DEFAULT_MAX_MESSAGE_BYTES
    )
    return DEFAULT_MAX_MESSAGE_BYTES


class MessageFramer:
    """Bytes in (``feed``), events out; no I/O, so every recovery rule is testable on its own."""

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._buffer = bytearray()
        self._length: int | None = None  # the Content-Length of the headers read so far
        self._in_body = False
        self._dropping = False  # after a bad header: everything until the next valid Content-Length goes

    @property
    def buffered(self) -> int:
        """Bytes held: a body being read, or at most one partial header line (dropped bytes are not kept)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Event]:
        self._buffer += data
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[Event]) -> bool:
        """Consume one header line or one body from the buffer; False when more bytes are needed."""
        if self._in_body:
            assert self._length is not None
            if len(self._buffer) < self._length:
                return False
            body = bytes(self._buffer[: self._length])
            del self._buffer[: self._length]
            self._in_body, self._length = False, None
            events.append(self._decode(body))
            return True
        end = self._buffer.find(b"\n")
        if end == -1:
            if len(self._buffer) > MAX_HEADER_LINE:
                self._drop(events, len(self._buffer) - _KEEP_WHILE_DROPPING, "a line too long to be a header")
            return False
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        self._header_line(line.rstrip(b"\r\n"), events)
        return True

    def _header_line(self, line: bytes, events: list[Event]) -> None:
        if not line.strip():
            # the blank line after the headers: the body follows (a stray one, or one while dropping: ignored)
            self._in_body = self._length is not None
            return
        match = _CONTENT_LENGTH_AT_END.search(line)
        if match is None:
            if self._dropping or not _HEADER_NAME.match(line.lstrip()):
                self._note_dropping(events, f"{len(line)} bytes that are not a header")
            return  # another header (Content-Type): nothing to do
        before = line[: match.start()]
        if before.strip():
            self._note_dropping(events, f"{len(before)} bytes before a Content-Length header")
        value = match.group(1)
        if not value.isdigit():
            self._refuse_length(events, f"Content-Length {_shown(value)} is not a number of bytes")
        elif len(value.lstrip(b"0")) > 19 or int(value) > self.max_message_bytes:  # 19: int() stays cheap
            limit = self.max_message_bytes
            self._refuse_length(
                events, f"Content-Length {_shown(value)} is over the {limit}-byte message limit"
            )
        else:
            self._length, self._dropping = int(value), False

    def _refuse_length(self, events: list[Event], reason: str) -> None:
        """A length that cannot be trusted: its body is dropped as it arrives, up to the next header."""
        if not self._dropping:
            events.append(Dropped(reason))
        self._length, self._dropping = None, True

    def _note_dropping(self, events: list[Event], what: str) -> None:
        logger.debug("dropped %s", what)
        if not self._dropping:
            events.append(Dropped(f"dropped {what}"))
        self._dropping = True
        self._length = None

    def _drop(self, events: list[Event], n: int, what: str) -> None:
        if n <= 0:
            return
        if not self._dropping:
            events.append(Dropped(f"dropped {what}"))
        self._dropping, self._length = True, None
        del self._buffer[:n]

    def _decode(self, body: bytes) -> Event:
        try:
            return Message(_loads(body))
        except ValueError as exc:
            first_error = exc
        too_long = _json_prefix(body)
        if too_long is not None:
            value, rest = too_long
            self._buffer[:0] = rest  # the next message's first bytes, taken by a length that was too long
            logger.warning("a Content-Length was %d bytes too long; message recovered", len(rest))
            return Message(value)
        # Too short: the rest is what arrived after it, up to the next header (already in the buffer).
        header = _CONTENT_LENGTH_START.search(self._buffer)
        tail_end = header.start() if header is not None else len(self._buffer)
        if 0 < tail_end <= self.max_message_bytes:
            try:
                value = _loads(body + bytes(self._buffer[:tail_end]))
            except ValueError:
                pass
            else:
                del self._buffer[:tail_end]
                logger.warning("a Content-Length was %d bytes too short; message recovered", tail_end)
                return Message(value)
        if isinstance(first_error, UnicodeDecodeError):
            return ParseError("the message body is not valid UTF-8")
        return ParseError(f"the message body is not JSON: {first_error}")


def _loads(body: bytes) -> Any:
    return json.loads(body.decode("utf-8"))


def _json_prefix(body: bytes) -> tuple[Any, bytes] | None:
    """(the JSON value ``body`` starts with, the bytes after it) when something follows a valid value."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        # the extra bytes may end inside a character: decode what comes before them
        text = body[: exc.start].decode("utf-8")
    try:
        value, end = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        return None
    end += len(text) - len(text.lstrip())
    rest = body[len(text[:end].encode("utf-8")) :]
    return (value, rest) if rest.strip() else None


def _shown(value: bytes) -> str:
    text = value[:40].decode("utf-8", "replace")
    return repr(text + ("..." if len(value) > 40 else ""))


# ---------------------------------------------------------------------------------------------- dispatch


def dispatch(protocol: Any, event: Event) -> None:
    """Hand one event to pygls's protocol, as ``pygls.io_.run_async`` does for the messages it reads."""
    if isinstance(event, Dropped):
        logger.warning("dice-lsp input: %s", event.reason)
        _log_to_client(protocol, f"dice-lsp: a message from the editor was dropped: {event.reason}")
        return
    if isinstance(event, ParseError):
        logger.warning("dice-lsp input: %s", event.reason)
        _send_error(protocol, None, PARSE_ERROR, f"Parse error: {event.reason}")
        return
    value = event.value
    if not isinstance(value, dict):
        kind = "a batch (array)" if isinstance(value, list) else f"a JSON {type(value).__name__}"
        logger.warning("dice-lsp input: %s is not a message", kind)
        _send_error(protocol, None, INVALID_REQUEST, f"Invalid request: {kind} is not a JSON-RPC message")
        return
    if value.get("jsonrpc") != "2.0":
        if "method" in value and isinstance(value.get("id"), (int, str)):
            _send_error(protocol, value["id"], INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0"')
        logger.warning("dice-lsp input: a message without jsonrpc 2.0 was ignored")
        return
    try:
        protocol.handle_message(protocol.structure_message(value))
    except Exception:  # as pygls's run_async: log it; the session goes on
        logger.exception("Unable to handle message")


def _send_error(protocol: Any, msg_id: Any, code: int, message: str) -> None:
    # Written as a plain dict: lsprotocol's ResponseErrorMessage drops an id of None, and JSON-RPC wants
    # "id": null when the request's id could not be read.
    protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})


def _log_to_client(protocol: Any, message: str) -> None:
    if not getattr(protocol, "initialize_received", False):
        return  # LSP: no notification before initialize (protocol_states.LifecycleProtocol keeps the flag)
    params = types.LogMessageParams(type=types.MessageType.Warning, message=message)
    try:
        protocol.notify(types.WINDOW_LOG_MESSAGE, params)
    except Exception:  # noqa: BLE001 - telling the client is a courtesy; the log has it
        logger.debug("could not send the log message", exc_info=True)


async def read_messages(
    read: Callable[[], Awaitable[bytes]], protocol: Any, *, max_message_bytes: int
) -> None:
    """Read until end of input, dispatching each message as soon as its bytes are in."""
    framer = MessageFramer(max_message_bytes)
    while True:
        chunk = await read()
        if not chunk:
            logger.info("end of input")
            return
        for event in framer.feed(chunk):
            dispatch(protocol, event)
            await asyncio.sleep(0)  # let tasks started by this message run before the next, as pygls does


# ---------------------------------------------------------------------------------------------- transports


def serve_stdio(
    server: JsonRPCServer,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> None:
    """pygls's ``JsonRPCServer._start_io_async`` with this module's reader."""
    source = stdin or sys.stdin.buffer
    read1 = getattr(source, "read1", source.read)
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))

    async def read() -> bytes:
        # one read at a time, and none after the last message (exit): nothing blocks the interpreter's exit
        return await asyncio.get_running_loop().run_in_executor(server.thread_pool, read1, READ_CHUNK)

    try:
        asyncio.run(read_messages(read, server.protocol, max_message_bytes=max_message_bytes))
    except BrokenPipeError:
        logger.error("Connection to the client is lost! Shutting down the server.")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()
