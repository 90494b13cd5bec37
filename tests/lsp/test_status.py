"""``dice/status``: loading -> ready with the model name and device; a model that cannot load -> error."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import action_commands, init_params, model_options, server_config, wait_status

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    await lsp_client.initialize_session(init_params(model_options(tiny_model)))
    yield
    await lsp_client.shutdown_session()


async def test_loading_then_ready_with_model_and_device(client: LanguageClient, tiny_model: Path) -> None:
    ready = await wait_status(client, "ready")
    first = client.dice_status[0]
    assert first["state"] == "loading"
    assert first["model"] is None and first["device"] is None
    assert str(tiny_model) in first["message"]
    assert set(ready) == {"state", "model", "device", "message"}
    assert ready["device"] == "cpu"
    assert ready["model"]  # the checkpoint's name
    assert "parameters" in ready["message"]
    assert any("loaded" in m.message for m in client.log_messages)


@pytest_lsp.fixture(scope="module", config=server_config())
async def broken(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    missing = tmp_path_factory.mktemp("no-model") / "missing"
    await lsp_client.initialize_session(init_params({"modelPath": str(missing), "device": "cpu"}))
    yield
    await lsp_client.shutdown_session()


async def test_unloadable_model_reports_error_and_keeps_serving(
    broken: LanguageClient, tmp_path: Path
) -> None:
    error = await wait_status(broken, "error")
    assert "missing" in error["message"]
    assert any(
        m.type == types.MessageType.Error and "cannot load the model" in m.message for m in broken.messages
    )
    # still serving: code actions need no model
    path = tmp_path / "k.cu"
    uri = path.as_uri()
    broken.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="cuda-cpp", version=1, text="// <MASK>\n"
            )
        )
    )
    actions = await broken.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
            ),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert [c[1] for c in action_commands(actions)] == [
        "dice.fillMask",
        "dice.fillAllMasks",
        "dice.validateKernel",
    ]
    # a command that needs the model answers with the reason instead of hanging
    result = await broken.workspace_execute_command_async(
        types.ExecuteCommandParams(command="dice.fillAllMasks", arguments=[uri])
    )
    assert result["ok"] is False and "missing" in result["message"]
