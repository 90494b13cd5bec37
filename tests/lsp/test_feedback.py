"""What the user learns when no candidate passes validation: the best failing candidate is still shown,
marked with its verdict and first error (``dice.showFailingSuggestions``), and ``dice/suggestionStatus`` says
how many candidates there were and why none was usable. The tiny random model's fills never compile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    statuses: list[dict[str, Any]] = []
    lsp_client.suggestion_status = statuses  # type: ignore[attr-defined]

    @lsp_client.feature("dice/suggestionStatus")
    def on_status(params: Any) -> None:
        statuses.append(params if isinstance(params, dict) else dict(params._asdict()))

    options = model_options(tiny_model, validationLevel="compile", candidates=2)
    await lsp_client.initialize_session(init_params(options))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


async def ask(client: LanguageClient, uri: str, at: types.Position) -> tuple[list, dict[str, Any]]:
    mark = len(client.suggestion_status)  # type: ignore[attr-defined]
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=at,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    await wait_for(client, "dice/suggestionStatus", lambda: len(client.suggestion_status) > mark)  # type: ignore
    items = result.items if isinstance(result, types.InlineCompletionList) else list(result or [])
    return items, client.suggestion_status[mark]  # type: ignore[attr-defined]


def _position(status: dict[str, Any]) -> tuple[int, int]:
    pos = status["position"]
    pos = pos if isinstance(pos, dict) else pos._asdict()
    return pos["line"], pos["character"]


async def test_failing_candidates_are_shown_marked_and_explained(
    client: LanguageClient, tmp_path: Path
) -> None:
    uri = open_document(client, tmp_path / "a.cu", TWO_MASKS)
    first, _ = mask_ranges(TWO_MASKS)
    items, status = await ask(client, uri, first.start)
    assert status["uri"] == uri and _position(status) == (first.start.line, first.start.character)
    assert status["usable"] == 0 and status["message"]
    if status["candidates"]:
        assert status["message"].startswith(f"{status['candidates']} candidate")
        assert "none compiled" in status["message"]
        (item,) = items  # the best failing one, marked
        assert item.command.command == "dice.suggestionAccepted"
        assert item.command.title.startswith("compiled ✗")
        (argument,) = item.command.arguments
        argument = argument if isinstance(argument, dict) else argument._asdict()
        assert argument["usable"] is False and argument["label"] == item.command.title
        assert status["shown"] == 1
    else:  # every fill was blank: nothing to show, and the message says so
        assert items == [] and "blank" in status["message"]


async def test_failing_candidates_can_be_hidden(client: LanguageClient, tmp_path: Path, tiny_model: Path):
    mark = len(client.log_messages)
    options = model_options(tiny_model, validationLevel="compile", candidates=2, showFailingSuggestions=False)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"dice": options}))
    await wait_for(
        client,
        types.WINDOW_LOG_MESSAGE,
        lambda: any(m.message.startswith("settings applied") for m in client.log_messages[mark:]),
    )
    uri = open_document(client, tmp_path / "b.cu", TWO_MASKS)
    first, _ = mask_ranges(TWO_MASKS)
    items, status = await ask(client, uri, first.start)
    assert items == [] and status["shown"] == 0 and status["usable"] == 0 and status["message"]
