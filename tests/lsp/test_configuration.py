"""Configuration: initializationOptions and workspace/didChangeConfiguration (pushed, or pulled through
workspace/configuration); bad values give a window message and the defaults; a new model path reloads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
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

BAD = {"candidates": "three", "policy": "greedy", "threshold": 2, "automaticTrigger": "yes", "futureKey": 1}


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    await lsp_client.initialize_session(init_params({**model_options(tiny_model), **BAD}))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


def inline(uri: str, pos: types.Position, automatic: bool) -> types.InlineCompletionParams:
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


async def change_settings(client: LanguageClient, settings: object) -> None:
    """Send didChangeConfiguration and wait until the server says it applied settings."""
    mark = len(client.log_messages)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=settings))
    await wait_for(
        client,
        types.WINDOW_LOG_MESSAGE,
        lambda: any(m.message.startswith("settings applied") for m in client.log_messages[mark:]),
    )


async def test_bad_initialization_options_warn_and_use_defaults(client: LanguageClient) -> None:
    warnings = [m.message for m in client.messages if m.type == types.MessageType.Warning]
    assert warnings == [
        "dice.candidates: expected an integer in [1, 64], got 'three'; using the default 3",
        "dice.policy: expected one of 'static', 'dynamic', 'entropy', got 'greedy';"
        " using the default 'dynamic'",
        "dice.threshold: expected a number in (0, 1] (any positive value with the entropy policy), got 2;"
        " using the default 0.9",
        "dice.automaticTrigger: expected true or false, got 'yes'; using the default True",
    ]
    applied = next(m.message for m in client.log_messages if m.message.startswith("settings applied"))
    assert (
        "'candidates': 3" in applied and "'policy': 'dynamic'" in applied and "'maxNewTokens': 8" in applied
    )
    assert any("futureKey" in m.message for m in client.log_messages)  # unknown keys: logged, not shown


async def test_automatic_trigger_setting_pushed_and_pulled(
    client: LanguageClient, tmp_path: Path, tiny_model: Path
) -> None:
    uri = open_document(client, tmp_path / "a.cu", TWO_MASKS)
    first, _ = mask_ranges(TWO_MASKS)
    assert (
        len(await client.text_document_inline_completion_async(inline(uri, first.start, automatic=True))) == 1
    )

    await change_settings(client, {"dice": {**model_options(tiny_model), "automaticTrigger": False}})
    assert await client.text_document_inline_completion_async(inline(uri, first.start, automatic=True)) == []
    assert await client.text_document_inline_completion_async(inline(uri, first.start, automatic=False))

    # settings = null: the server pulls the "dice" section (workspace/configuration)
    client.set_configuration({**model_options(tiny_model), "automaticTrigger": True}, section="dice")
    await change_settings(client, None)
    assert (
        len(await client.text_document_inline_completion_async(inline(uri, first.start, automatic=True))) == 1
    )


async def test_bad_value_in_a_change_keeps_serving(client: LanguageClient, tiny_model: Path) -> None:
    mark = len(client.messages)
    await change_settings(client, {"dice": {**model_options(tiny_model), "maxNewTokens": -5}})
    assert [m.message for m in client.messages[mark:]] == [
        "dice.maxNewTokens: expected an integer in [1, 32768], got -5; using the default 256"
    ]
    mark = len(client.messages)
    await change_settings(client, {"dice": "not an object"})
    problem = "dice settings: expected an object, got str; using the defaults"
    assert client.messages[mark].message == problem
    await change_settings(client, {"dice": model_options(tiny_model)})


async def test_new_model_path_reloads(client: LanguageClient, tiny_model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "other-model"
    shutil.copytree(tiny_model, copy)
    mark = len(client.dice_status)
    await change_settings(client, {"dice": {**model_options(tiny_model), "modelPath": str(copy)}})
    # Earlier tests' reloads may still report after ``mark``: wait for the one naming the new path.
    loading = await wait_status(client, "loading", after=mark, where=lambda s: str(copy) in s["message"])
    ready = await wait_status(client, "ready", after=client.dice_status.index(loading))
    assert ready["model"] == "other-model"
