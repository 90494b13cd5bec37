"""Robustness: malformed and out-of-order messages, a 5 MB document, binary content, 100 rapid edits with
requests in between, a client that vanishes, and a clean shutdown/exit. The server keeps serving and never
edits a document on its own."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import (
    TWO_MASKS,
    WAIT_S,
    RawServer,
    free_port,
    init_params,
    open_document,
    server_config,
    serving,
    wait_diagnostics,
    wait_status,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

ORIGIN = types.Position(line=0, character=0)


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    missing = tmp_path_factory.mktemp("none") / "no-model"
    await lsp_client.initialize_session(init_params({"modelPath": str(missing)}))
    await wait_status(lsp_client, "error")
    yield
    await lsp_client.shutdown_session()
    assert lsp_client._server.returncode == 0  # exit after shutdown: status 0 (LSP)
    assert lsp_client.applied_edits == []  # nothing here asked for an edit: none was made


def code_action_params(uri: str) -> types.CodeActionParams:
    return types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(start=ORIGIN, end=ORIGIN),
        context=types.CodeActionContext(diagnostics=[]),
    )


def inline_params(uri: str, pos: types.Position, automatic: bool = False) -> types.InlineCompletionParams:
    kind = (
        types.InlineCompletionTriggerKind.Automatic
        if automatic
        else types.InlineCompletionTriggerKind.Invoked
    )
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=pos,
        context=types.InlineCompletionContext(trigger_kind=kind),
    )


async def test_malformed_messages(tmp_path: Path) -> None:
    server = await RawServer.start()
    await server.initialize({"modelPath": str(tmp_path / "none")})
    # A body that is not JSON, then a message without "jsonrpc": logged and skipped.
    server.send_bytes(b"{not json")
    server.send({"id": 99, "method": "textDocument/hover"})
    # A request whose params do not fit its method gets InvalidParams (not silence).
    server.send(
        {"jsonrpc": "2.0", "id": 1, "method": "textDocument/codeAction", "params": {"textDocument": 5}}
    )
    assert (await server.response(1))["error"]["code"] == -32602
    # An unknown method: MethodNotFound.
    server.send({"jsonrpc": "2.0", "id": 2, "method": "dice/noSuchMethod", "params": {}})
    assert (await server.response(2))["error"]["code"] == -32601
    # A response to a request the server never sent, and a notification nobody handles: ignored.
    server.send({"jsonrpc": "2.0", "id": "nobody-asked", "result": None})
    server.send({"jsonrpc": "2.0", "method": "$/unknownNotification", "params": {}})
    # Still serving, and it exits cleanly.
    server.send({"jsonrpc": "2.0", "id": 3, "method": "shutdown"})
    assert (await server.response(3)) == {"jsonrpc": "2.0", "id": 3, "result": None}
    server.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(server.proc.wait(), WAIT_S) == 0


async def test_out_of_order_and_unknown_documents(client: LanguageClient, tmp_path: Path) -> None:
    uri = (tmp_path / "never-opened.cu").as_uri()
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=7),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="// <MASK>\n")],
        )
    )
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    assert await client.text_document_inline_completion_async(inline_params(uri, ORIGIN)) == []
    assert not await client.text_document_code_action_async(code_action_params(uri))
    assert (
        await client.text_document_code_lens_async(types.CodeLensParams(types.TextDocumentIdentifier(uri)))
        == ()
    )
    hover = types.HoverParams(text_document=types.TextDocumentIdentifier(uri), position=ORIGIN)
    assert await client.text_document_hover_async(hover) is None
    for arguments in ([], [42], [uri, {"line": -1}], [{"nothing": True}]):
        result = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="dice.fillMask", arguments=arguments)
        )
        assert result["ok"] is False and result["message"].startswith(("dice.fillMask", "cannot read"))
    # positions far outside an open document clamp instead of failing
    real = open_document(client, tmp_path / "small.cu", "__global__ void k() {\n}\n")
    far = types.Position(line=10_000, character=10_000)
    assert await client.text_document_inline_completion_async(inline_params(real, far)) == []


async def test_five_megabyte_document(client: LanguageClient, tmp_path: Path) -> None:
    filler = "// " + "x" * 96 + "\n"
    text = filler * (5 * 1024 * 1024 // len(filler)) + TWO_MASKS
    assert len(text.encode()) > 5 * 1024 * 1024
    uri = open_document(client, tmp_path / "huge.cu", text)
    got = await wait_diagnostics(client, uri, lambda d: len(d) == 2)
    assert got[0].range.start.line == text.count("\n") - TWO_MASKS.count("\n") + 5
    assert len(await client.text_document_code_action_async(code_action_params(uri))) == 2


async def test_binary_content(client: LanguageClient, tmp_path: Path) -> None:
    text = "\x00\x01\x02ELF\x00" + "\ufffd" * 100 + "/* <MASK> */" + "\x00" * 50
    uri = open_document(client, tmp_path / "blob.cu", text)
    assert await wait_diagnostics(client, uri, lambda d: True) == []
    assert await client.text_document_inline_completion_async(inline_params(uri, ORIGIN)) == []
    assert not await client.text_document_code_action_async(code_action_params(uri))
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="dice.fillAllMasks", arguments=[uri])
    )
    assert result == {"ok": False, "message": "this document is binary or too large for DICE"}


async def test_rapid_edits_with_requests_between(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "rapid.cu", TWO_MASKS)
    pending = []
    line = TWO_MASKS.splitlines()[2]
    for version in range(2, 102):
        # type one character at the end of the comment line, as an incremental change
        at = types.Position(line=2, character=len(line) + 1 + version - 2)  # +1: "𝄞" is 2 UTF-16 units
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text="z")
                ],
            )
        )
        pending.append(client.text_document_code_action_async(code_action_params(uri)))
        pending.append(
            client.text_document_inline_completion_async(inline_params(uri, ORIGIN, automatic=True))
        )
    results = await asyncio.wait_for(asyncio.gather(*pending), WAIT_S)
    assert len(results) == 200
    assert all(len(r) == 2 for r in results[0::2])  # every code-action request answered in full
    got = await wait_diagnostics(client, uri, lambda d: len(d) == 2)
    assert all(d.range.start.line in (5, 9) for d in got)
    server_text = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="dice.fillMask", arguments=[uri, {"line": 0, "character": 0}])
    )
    assert server_text == {"ok": False, "message": "no mask at line 1"}


async def test_vanished_client_lets_the_server_exit(tmp_path: Path) -> None:
    server = await RawServer.start()
    await server.initialize({"modelPath": str(tmp_path / "none")})
    server.proc.stdin.close()  # the editor is gone without shutdown/exit
    assert await asyncio.wait_for(server.proc.wait(), WAIT_S) == 1


async def test_entry_point_options() -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "lsp_server", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("dice-lsp ")
    bad = subprocess.run(
        [sys.executable, "-m", "lsp_server", "--tcp", "nohost"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr


async def test_tcp_transport(tmp_path: Path) -> None:
    port = free_port()
    async with serving("--tcp", f"127.0.0.1:{port}", env={"DICE_LSP_TOKEN": "tcp-test-token"}) as proc:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        server = RawServer.__new__(RawServer)
        server.proc = type("Pipe", (), {"stdin": writer, "stdout": reader})()
        result = await server.initialize({"modelPath": str(tmp_path / "none"), "token": "tcp-test-token"})
        assert "inlineCompletionProvider" in result["result"]["capabilities"]
        server.send({"jsonrpc": "2.0", "id": 1, "method": "shutdown"})
        assert (await server.response(1))["result"] is None
        server.send({"jsonrpc": "2.0", "method": "exit"})
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
