"""Cancellation: an explicit ``$/cancelRequest`` stops an inline completion and a command; the work-done
progress of a command is cancellable (``window/workDoneProgress/cancel``); the server serves on after each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import LanguageClient

from .conftest import (
    TWO_MASKS,
    init_params,
    mask_ranges,
    model_options,
    open_document,
    server_config,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# A large budget, so that the request is still generating when the cancel arrives.
LONG = TWO_MASKS.replace("/* <MASK:4> */", "/* <MASK:1024> */")


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    options = model_options(tiny_model, maxNewTokens=1024, candidates=1)
    await lsp_client.initialize_session(init_params(options))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


def invoked(uri: str, pos: types.Position) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=pos,
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )


async def test_cancel_request_stops_inline_completion(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "long.cu", LONG)
    long_mask, short_mask = mask_ranges(LONG)
    mark = len(client.dice_status)
    pending = asyncio.ensure_future(
        client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, invoked(uri, long_mask.start), msg_id="inline-long"
        )
    )
    await wait_status(client, "busy", after=mark)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="inline-long"))
    with pytest.raises(JsonRpcRequestCancelled):
        await asyncio.wait_for(pending, 60)
    await wait_status(client, "ready", after=mark)
    # The server serves on: a short request after the cancelled one is answered.
    items = await client.text_document_inline_completion_async(invoked(uri, short_mask.start))
    assert items and items[0].range == short_mask


async def test_cancel_request_and_progress_cancel_stop_a_command(
    client: LanguageClient, tmp_path: Path
) -> None:
    uri = open_document(client, tmp_path / "cmd.cu", "// command\n" + LONG)
    for how in ("$/cancelRequest", "window/workDoneProgress/cancel"):
        token = f"fill-{how}"
        params = types.ExecuteCommandParams(
            command="dice.fillAllMasks", arguments=[uri], work_done_token=token
        )
        client.progress_reports[token] = []
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id=token)
        )

        def generating(token: str = token) -> bool:
            return any(
                isinstance(r, types.WorkDoneProgressReport) and r.percentage
                for r in client.progress_reports[token]
            )

        await wait_for(client, types.PROGRESS, generating)
        if how == "$/cancelRequest":
            client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=token))
            with pytest.raises(JsonRpcRequestCancelled):
                await asyncio.wait_for(pending, 60)
        else:
            client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
            assert await asyncio.wait_for(pending, 60) == {"ok": False, "message": "cancelled"}
        await wait_for(
            client,
            types.PROGRESS,
            lambda t=token: isinstance(client.progress_reports[t][-1], types.WorkDoneProgressEnd),
        )
        reports = client.progress_reports[token]
        assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].cancellable
        assert reports[-1].message == "cancelled"
        assert max(r.percentage or 0 for r in reports[1:-1]) < 100
    assert client.applied_edits == []  # nothing was written
