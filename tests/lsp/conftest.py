"""pytest-lsp fixtures: the real ``dice-lsp`` over stdio, a recording client, and the tiny checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from pytest_lsp.client import make_test_lsp_client

SERVER_COMMAND = [sys.executable, "-m", "lsp_server", "--log-level", "INFO"]
WAIT_S = 120.0  # upper bound on one wait for a server event (events come much sooner; CI machines are slow)

# Two masks after non-ASCII text (UTF-8 and UTF-16 offsets differ), a host function, a multi-line mask.
TWO_MASKS = """\
#include <cuda_runtime.h>

// scale: y = a * x   (é, 𝄞: non-ASCII before the masks)
__global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    /* <MASK:4> */
}

__device__ float square(float v) {
    // <MASK:4>
}

void host_helper(int* out) {
    *out = 1;
}
"""

KERNELBENCH_REF = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(1024), torch.randn(1024)]


def get_init_inputs():
    return []
"""


class DiceTestClient(LanguageClient):
    """Records ``dice/status`` and answers ``workspace/applyEdit`` like an editor that accepts edits."""

    dice_status: list[dict[str, Any]]
    applied_edits: list[types.ApplyWorkspaceEditParams]


def make_client() -> LanguageClient:
    client = make_test_lsp_client()
    client.dice_status = []  # type: ignore[attr-defined]
    client.applied_edits = []  # type: ignore[attr-defined]

    @client.feature("dice/status")
    def on_status(params: Any) -> None:
        client.dice_status.append(_as_dict(params))  # type: ignore[attr-defined]

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def on_apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        client.applied_edits.append(params)  # type: ignore[attr-defined]
        return types.ApplyWorkspaceEditResult(applied=True)

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def on_code_lens_refresh(params: Any) -> None:
        return None

    return client


def _as_dict(params: Any) -> dict[str, Any]:
    if isinstance(params, dict):
        return params
    if hasattr(params, "_asdict"):
        return dict(params._asdict())
    return dict(vars(params))


async def server_stats(client: LanguageClient) -> dict[str, int]:
    """The server's own counters of work done (``dice/stats``): model calls, validations, cache hits,
    suggestions typed through."""
    result = await asyncio.wait_for(client.protocol.send_request_async("dice/stats", None), WAIT_S)
    return {str(k): int(v) for k, v in _as_dict(result).items()}


def server_config(env: dict[str, str] | None = None) -> ClientServerConfig:
    return ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client, server_env=env)


def init_params(options: dict[str, Any] | None, root: Path | None = None) -> types.InitializeParams:
    return types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        initialization_options=options,
        root_uri=root.as_uri() if root else None,
    )


async def wait_for(client: LanguageClient, method: str, predicate: Callable[[], bool]) -> None:
    """Wait (on notifications, never on sleeps) until ``predicate`` holds."""

    async def loop() -> None:
        while not predicate():
            await client.wait_for_notification(method)

    await asyncio.wait_for(loop(), WAIT_S)


async def wait_status(
    client: LanguageClient,
    state: str,
    *,
    after: int = 0,
    where: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """The first ``dice/status`` with ``state`` (and matching ``where``) at or after index ``after``."""

    def found() -> dict[str, Any] | None:
        return next(
            (
                s
                for s in client.dice_status[after:]  # type: ignore
                if s.get("state") == state and (where is None or where(s))
            ),
            None,
        )

    await wait_for(client, "dice/status", lambda: found() is not None)
    status = found()
    assert status is not None
    return status


async def wait_diagnostics(client: LanguageClient, uri: str, predicate: Callable[[list], bool]) -> list:
    await wait_for(
        client,
        types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS,
        lambda: uri in client.diagnostics and predicate(list(client.diagnostics[uri])),
    )
    return list(client.diagnostics[uri])


def open_document(
    client: LanguageClient, path: Path, text: str, version: int = 1, language: str = "cuda-cpp"
) -> str:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)
        )
    )
    return uri


def replace_document(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def apply_text_edits(text: str, edits: list[types.TextEdit]) -> str:
    """Apply LSP edits (ranges in ``text``, UTF-16) the way an editor does."""
    from dice.cuda_source import PositionIndex

    index = PositionIndex(text)
    data = index.data
    spans = sorted(
        (index.position_to_byte(e.range.start), index.position_to_byte(e.range.end), e.new_text)
        for e in edits
    )
    out, cursor = [], 0
    for start, end, new in spans:
        out += [data[cursor:start], new.encode("utf-8")]
        cursor = end
    out.append(data[cursor:])
    return b"".join(out).decode("utf-8")


def action_commands(actions: Any) -> list[tuple[str, str, list[Any]]]:
    """(title, command id, arguments) of code actions.

    lsprotocol's client-side converter turns every CodeAction that carries a command into a ``Command``
    whose ``command`` is the repr of the nested command object; undo that here.
    """
    import ast

    out = []
    for action in actions or []:
        if isinstance(action, types.CodeAction):
            out.append((action.title, action.command.command, list(action.command.arguments or [])))
        elif isinstance(action.command, str) and action.command.startswith("{"):
            nested = ast.literal_eval(action.command)
            out.append((action.title, nested["command"], list(nested.get("arguments") or [])))
        else:
            out.append((action.title, action.command, list(action.arguments or [])))
    return out


def mask_ranges(text: str) -> list[types.Range]:
    from dice.cuda_source import parse_document
    from lsp_server.convert import lsp_range

    return [lsp_range(m.range) for m in parse_document(text).masks]


class RawServer:
    """``dice-lsp`` driven with hand-written bytes: for messages a well-behaved client cannot send."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> RawServer:
        proc = await asyncio.create_subprocess_exec(
            *SERVER_COMMAND,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(proc)

    def send_bytes(self, body: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def send(self, message: dict[str, Any]) -> None:
        self.send_bytes(json.dumps(message).encode())

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        length = 0
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT_S)
            if not line:
                raise EOFError("the server closed its output")
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            elif line in (b"\r\n", b"\n"):
                break
        return json.loads(await asyncio.wait_for(self.proc.stdout.readexactly(length), WAIT_S))

    async def response(self, msg_id: Any) -> dict[str, Any]:
        """Read until the response to ``msg_id`` (notifications and server requests are skipped)."""
        while True:
            message = await self.read()
            if message.get("id") == msg_id and "method" not in message:
                return message

    async def initialize(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "processId": None,
                    "rootUri": None,
                    "capabilities": {},
                    "initializationOptions": options,
                },
            }
        )
        result = await self.response(0)
        self.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        return result


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("lsp-dice-tiny"))


def model_options(model: Path, **overrides: Any) -> dict[str, Any]:
    """Settings for fast CPU tests: the tiny model, small budgets, no validation unless asked."""
    options: dict[str, Any] = {
        "modelPath": str(model),
        "device": "cpu",
        "candidates": 2,
        "maxNewTokens": 8,
        "validationLevel": "none",
        "maxLatencyMs": 600_000,
    }
    options.update(overrides)
    return options


# ------------------------------------------------------------------------------------------ socket servers
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.asynccontextmanager
async def serving(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """A ``dice-lsp`` subprocess started with ``args``, once it logged "Serving on"."""
    environ = {k: v for k, v in os.environ.items() if k != "DICE_LSP_TOKEN"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lsp_server",
        *args,
        env={**environ, **(env or {})},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        lines = []
        while not lines or b"Serving on" not in lines[-1]:
            line = await asyncio.wait_for(proc.stderr.readline(), WAIT_S)
            assert line, b"".join(lines).decode()
            lines.append(line)
        proc.startup_log = b"".join(lines).decode()  # type: ignore[attr-defined]
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
