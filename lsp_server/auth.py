"""Who may drive ``dice-lsp`` over a socket: only the user who started it.

The server validates files by running their ``dice-spec`` Python on the GPU machine, so a client is as
powerful as the user. stdio needs nothing (the editor started the process); the socket transports do:

- ``--tcp HOST:PORT`` binds to loopback only (``127.0.0.0/8``, ``::1``, ``localhost``); another host is
  refused unless ``--allow-remote`` is given (then with a warning). Every connection must authenticate with
  a token: its first message must be the ``initialize`` request with ``initializationOptions.token`` equal
  to the server's token (compared with :func:`hmac.compare_digest`). Otherwise the connection is closed
  without a byte written and without that message, or any later one, being dispatched; the server keeps
  listening for its user. The token is removed from the options before pygls sees them (it is not a
  setting, and is never logged). Once one client is in, other connections are closed at once; when it
  leaves the server ends, as before.
- The token comes from ``$DICE_LSP_TOKEN``, else from ``--token-file PATH`` (a regular file of ours that
  neither group nor others may read), else it is generated into a new 0600 file under the user's runtime
  folder (``$XDG_RUNTIME_DIR``, else a 0700 ``dice-lsp-<uid>`` folder in the temp folder), whose path is
  printed to stderr and which is removed when the server ends.
- ``--socket PATH``: a Unix socket created under umask 0177 (mode 0600) in a folder only we can enter
  (created 0700, or an existing one of ours without group/other permissions). The file permissions are the
  authentication: no token.

Why our own code: pygls's ``start_tcp`` has no authentication hook and no Unix socket transport; the reading
itself is :mod:`lsp_server.framing`'s (its framer and dispatch, unchanged), with the handshake in front.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pygls.server import JsonRPCServer

from lsp_server.framing import READ_CHUNK, Message, MessageFramer, dispatch, serving_logger

logger = logging.getLogger(__name__)

TOKEN_ENV = "DICE_LSP_TOKEN"
HANDSHAKE_MAX_BYTES = 1024 * 1024  # the first message (initialize) of a client not yet authenticated
HANDSHAKE_TIMEOUT_S = 30.0  # a connection that sends no initialize in this time is closed


class AuthSetupError(Exception):
    """The server cannot start its socket transport safely (the message says why)."""


@dataclass(frozen=True)
class Token:
    value: str
    generated: Path | None = None  # the file we wrote it to (removed at exit), None when the user gave it


# ------------------------------------------------------------------------------------------------ setup


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only (no name resolution: ``localhost``
    and literal loopback addresses)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind_host(host: str, *, allow_remote: bool) -> None:
    """Refuse a non-loopback ``host`` unless ``allow_remote``; with it, warn on stderr."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise AuthSetupError(
            f"refusing to listen on {host!r}: --tcp binds to loopback (127.0.0.1, ::1, localhost) only; "
            "pass --allow-remote to listen on another address (clients still need the token)"
        )
    print(
        f"dice-lsp: WARNING: listening on {host!r}, reachable from other machines; anyone with the token "
        "can run code as you",
        file=sys.stderr,
    )


def _check_private(path: Path, what: str, *, folder: bool) -> os.stat_result:
    info = path.lstat()
    kind = stat.S_ISDIR if folder else stat.S_ISREG
    if not kind(info.st_mode):
        raise AuthSetupError(f"{what} {path} is not a {'folder' if folder else 'regular file'}")
    if info.st_uid != os.getuid():
        raise AuthSetupError(f"{what} {path} belongs to another user")
    if info.st_mode & 0o077:
        raise AuthSetupError(
            f"{what} {path} has mode {stat.S_IMODE(info.st_mode):04o}: group and others must have no "
            f"access (chmod {'700' if folder else '600'} {path})"
        )
    return info


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path`` (surrounding blanks stripped); refused unless a regular file of ours with no
    group/other permission bits, or when empty."""
    file = Path(path)
    try:
        _check_private(file, "token file", folder=False)
        token = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AuthSetupError(f"cannot read token file {file}: {exc.strerror or exc}") from exc
    if not token:
        raise AuthSetupError(f"token file {file} is empty")
    return token


def runtime_folder() -> Path:
    """``$XDG_RUNTIME_DIR`` when it is a private folder of ours, else ``<tmp>/dice-lsp-<uid>`` (0700)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        with contextlib.suppress(OSError, AuthSetupError):
            _check_private(Path(xdg), "runtime folder", folder=True)
            return Path(xdg)
    folder = Path(tempfile.gettempdir()) / f"dice-lsp-{os.getuid()}"
    private_folder(folder)
    return folder


def private_folder(folder: Path) -> None:
    """Create ``folder`` with mode 0700, or check that the existing one is ours and private."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    _check_private(folder, "folder", folder=True)


def load_token(token_file: str | None, environ: dict[str, str] | None = None) -> Token:
    """The token from ``$DICE_LSP_TOKEN``, else ``token_file``, else a new one written to a new 0600 file
    in :func:`runtime_folder` (its path printed on stderr)."""
    env = os.environ if environ is None else environ
    if TOKEN_ENV in env:
        value = env[TOKEN_ENV].strip()
        if not value:
            raise AuthSetupError(f"${TOKEN_ENV} is set but empty")
        return Token(value)
    if token_file:
        return Token(read_token_file(token_file))
    value = secrets.token_urlsafe(32)
    path = runtime_folder() / f"dice-lsp-{os.getpid()}-{secrets.token_hex(4)}.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(value + "\n")
    print(f"dice-lsp: token file: {path}", file=sys.stderr, flush=True)
    return Token(value, generated=path)


@contextlib.contextmanager
def unix_socket_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Make ready a path for the Unix socket (its folder private; a stale socket there removed; anything
    else there refused) and remove the socket when done."""
    sock = Path(path).absolute()
    private_folder(sock.parent)
    if sock.is_symlink() or (sock.exists() and not stat.S_ISSOCK(sock.lstat().st_mode)):
        raise AuthSetupError(f"{sock} exists and is not a socket: refusing to replace it")
    sock.unlink(missing_ok=True)
    try:
        yield sock
    finally:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(sock.lstat().st_mode):
                sock.unlink()


# -------------------------------------------------------------------------------------------- handshake


def authenticates(value: Any, token: str) -> bool:
    """Whether a decoded first message is ``initialize`` carrying ``initializationOptions.token`` equal to
    ``token``."""
    if not isinstance(value, dict) or value.get("method") != "initialize":
        return False
    params = value.get("params")
    options = params.get("initializationOptions") if isinstance(params, dict) else None
    sent = options.get("token") if isinstance(options, dict) else None
    if not isinstance(sent, str):
        return False
    return hmac.compare_digest(sent.encode("utf-8"), token.encode("utf-8"))


def _without_token(value: dict[str, Any]) -> dict[str, Any]:
    options = dict(value["params"]["initializationOptions"])
    options.pop("token", None)
    return {**value, "params": {**value["params"], "initializationOptions": options or None}}


async def _first_message(reader: asyncio.StreamReader, framer: MessageFramer) -> tuple[Any, list[Any]]:
    """The first event's value (None when it is not a message) and the events read after it."""
    while True:
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            return None, []
        events = framer.feed(chunk)
        if events:
            first = events[0]
            return (first.value if isinstance(first, Message) else None), events[1:]


class Gate:
    """The connection handler: authenticates each client (``token`` None: the socket's permissions already
    did), then reads its messages with :mod:`lsp_server.framing`'s framer and dispatch."""

    def __init__(self, server: JsonRPCServer, token: str | None, *, max_message_bytes: int) -> None:
        self.server = server
        self.token = token
        self.max_message_bytes = max_message_bytes
        self.done = asyncio.Event()  # the authenticated client left
        self.busy = False

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.busy:
            logger.warning("dice-lsp: a second connection was refused: a client is already connected")
            await _close(writer)
            return
        framer = MessageFramer(min(self.max_message_bytes, HANDSHAKE_MAX_BYTES))
        pending: list[Any] = []
        if self.token is not None:
            try:
                first, pending = await asyncio.wait_for(_first_message(reader, framer), HANDSHAKE_TIMEOUT_S)
            except TimeoutError:
                first = None
            if self.busy or not authenticates(first, self.token):
                logger.warning("dice-lsp: a connection without the right token was closed")
                await _close(writer)
                return
            pending.insert(0, Message(_without_token(first)))
        self.busy = True
        framer.max_message_bytes = self.max_message_bytes
        self.server.protocol.set_writer(writer)  # type: ignore[arg-type]
        try:
            await self._serve(reader, framer, pending)
        finally:
            self.done.set()

    async def _serve(self, reader: asyncio.StreamReader, framer: MessageFramer, events: list[Any]) -> None:
        # framing.read_messages's loop, continued with the framer that read the handshake
        while True:
            for event in events:
                dispatch(self.server.protocol, event)
                await asyncio.sleep(0)
            chunk = await reader.read(READ_CHUNK)
            if not chunk:
                logger.info("end of input")
                return
            events = framer.feed(chunk)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _run(server: JsonRPCServer, start: Any, gate: Gate) -> None:
    async def main() -> None:
        listener = await start(gate)
        serving_logger.info("Serving on %s", ", ".join(str(s.getsockname()) for s in listener.sockets))
        async with listener:
            await gate.done.wait()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        logger.debug("Server was cancelled")
    finally:
        server.shutdown()


def serve_tcp_with_token(
    server: JsonRPCServer, host: str, port: int, token: str, *, max_message_bytes: int
) -> None:
    """Listen on ``host:port`` for one client that authenticates with ``token``; the server ends when it
    leaves. The bind host is checked by the caller (:func:`check_bind_host`)."""
    gate = Gate(server, token, max_message_bytes=max_message_bytes)
    _run(server, lambda g: asyncio.start_server(g, host, port), gate)


def serve_unix(server: JsonRPCServer, path: str | os.PathLike[str], *, max_message_bytes: int) -> None:
    """Listen on a Unix socket at ``path`` (mode 0600, private folder) for one client."""
    gate = Gate(server, None, max_message_bytes=max_message_bytes)
    with unix_socket_path(path) as sock:

        async def start(g: Gate) -> asyncio.Server:
            old = os.umask(0o177)
            try:
                listener = await asyncio.start_unix_server(g, os.fspath(sock))
            finally:
                os.umask(old)
            os.chmod(sock, 0o600)
            return listener

        _run(server, start, gate)
