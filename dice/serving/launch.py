"""Starting ``dice serve``: the engine, the app and uvicorn on a socket we bind ourselves (so that port 0
gives a free port the caller can read back, and a port in use is a clear error before the model loads)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from dice.serving.app import DiceServer, ServeConfig

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); OSError says why not (in use, no such address)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@dataclass
class RunningServer:
    """A server started by ``start_in_thread``: ``url`` to reach it, ``stop()`` to end it."""

    server: DiceServer
    uvicorn: Any
    thread: threading.Thread
    url: str

    def stop(self, timeout: float = 15.0) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout)
        self.server.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def uvicorn_server(server: DiceServer, *, log_level: str = "warning") -> Any:
    import uvicorn

    config = uvicorn.Config(
        server.app,
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
        lifespan="off",
    )
    return uvicorn.Server(config)


def start_in_thread(
    engine: Any, config: ServeConfig, *, host: str = "127.0.0.1", port: int = 0
) -> RunningServer:
    """Serve ``engine`` from a background thread (tests, benchmarks); returns once it accepts connections."""
    sock = bind(host, port)
    server = DiceServer(engine, config)
    userver = uvicorn_server(server)
    userver.config.install_signal_handlers = False  # uvicorn >= 0.29 skips them off the main thread
    thread = threading.Thread(
        target=userver.run, kwargs={"sockets": [sock]}, name="dice-serve-http", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not userver.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.close()
            raise RuntimeError("dice serve did not start")
        time.sleep(0.01)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningServer(server, userver, thread, f"http://{shown}:{bound_port}")


def serve_forever(engine: Any, config: ServeConfig, sock: socket.socket, *, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then drain and stop the model thread."""
    server = DiceServer(engine, config)
    try:
        uvicorn_server(server, log_level=log_level).run(sockets=[sock])
    finally:
        server.close()
