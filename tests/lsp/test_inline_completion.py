"""textDocument/inlineCompletion with the tiny model: items at a mask (range = the mask comment), implicit
masks inside kernel bodies, invoked vs automatic triggers, selectedCompletionInfo, superseded and stale
requests, and an accepted item becoming a region with a verdict lens and hover."""

from __future__ import annotations

import asyncio
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
    replace_document,
    server_config,
    server_stats,
    wait_status,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

MULTI_LINE_MASK = """\
__global__ void k(float* y) {
    /*
       <MASK:4>
    */
}
"""


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    await lsp_client.initialize_session(init_params(model_options(tiny_model)))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


def request(
    uri: str,
    pos: types.Position,
    *,
    automatic: bool = False,
    selected: types.SelectedCompletionInfo | None = None,
) -> types.InlineCompletionParams:
    kind = (
        types.InlineCompletionTriggerKind.Automatic
        if automatic
        else types.InlineCompletionTriggerKind.Invoked
    )
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=pos,
        context=types.InlineCompletionContext(trigger_kind=kind, selected_completion_info=selected),
    )


def items_of(result: object) -> list[types.InlineCompletionItem]:
    if isinstance(result, types.InlineCompletionList):
        return list(result.items)
    return list(result or [])


async def test_invoked_at_a_mask_gives_ranked_candidates(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "a.cu", TWO_MASKS)
    first, _ = mask_ranges(TWO_MASKS)
    items = items_of(await client.text_document_inline_completion_async(request(uri, first.start)))
    assert 1 <= len(items) <= 2  # candidates = 2, duplicates collapsed
    assert len({i.insert_text for i in items}) == len(items)
    for item in items:
        assert item.range == first  # replaces the whole mask comment, single line
        assert isinstance(item.insert_text, str) and item.insert_text.strip()
    # the cursor right after the comment is still "at" the mask
    again = items_of(await client.text_document_inline_completion_async(request(uri, first.end)))
    assert [i.insert_text for i in again] == [i.insert_text for i in items]


async def test_automatic_trigger_gives_the_best_one(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "b.cu", TWO_MASKS)
    first, second = mask_ranges(TWO_MASKS)
    invoked = items_of(await client.text_document_inline_completion_async(request(uri, second.start)))
    automatic = items_of(
        await client.text_document_inline_completion_async(request(uri, second.start, automatic=True))
    )
    assert len(automatic) == 1 and automatic[0].range == second
    assert automatic[0].insert_text == invoked[0].insert_text  # the top-ranked candidate


async def test_implicit_mask_inside_a_kernel_body(client: LanguageClient, tmp_path: Path) -> None:
    text = TWO_MASKS.replace("    /* <MASK:4> */\n", "    \n")
    uri = open_document(client, tmp_path / "c.cu", text)
    cursor = types.Position(line=5, character=4)  # the blank line inside scale()
    items = items_of(await client.text_document_inline_completion_async(request(uri, cursor)))
    assert items and all(i.range == types.Range(start=cursor, end=cursor) for i in items)
    # host code and the file's top level get nothing
    host = types.Position(line=13, character=4)
    assert text.splitlines()[13].startswith("    *out")
    assert items_of(await client.text_document_inline_completion_async(request(uri, host))) == []
    top = types.Position(line=0, character=0)
    assert items_of(await client.text_document_inline_completion_async(request(uri, top))) == []


async def test_multi_line_mask_is_left_to_commands(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "m.cu", MULTI_LINE_MASK)
    (rng,) = mask_ranges(MULTI_LINE_MASK)
    assert rng.start.line != rng.end.line
    assert items_of(await client.text_document_inline_completion_async(request(uri, rng.start))) == []


async def test_selected_completion_info_is_honoured(client: LanguageClient, tmp_path: Path) -> None:
    text = TWO_MASKS.replace("    /* <MASK:4> */\n", "    y[i] = a * x\n")
    uri = open_document(client, tmp_path / "s.cu", text)
    line = 5
    end = len("    y[i] = a * x")
    word = types.Range(start=types.Position(line, end - 1), end=types.Position(line, end))
    selected = types.SelectedCompletionInfo(range=word, text="x[i];")
    items = items_of(
        await client.text_document_inline_completion_async(request(uri, word.end, selected=selected))
    )
    assert items
    for item in items:
        assert item.range == word
        assert item.insert_text.startswith("x[i];") and len(item.insert_text) > len("x[i];")


async def test_newer_request_supersedes_older(client: LanguageClient, tmp_path: Path) -> None:
    text = "// a text no earlier request saw (the service caches fills by content)\n" + TWO_MASKS
    uri = open_document(client, tmp_path / "n.cu", text)
    first, second = mask_ranges(text)
    older = asyncio.ensure_future(client.text_document_inline_completion_async(request(uri, first.start)))
    await wait_status(client, "busy", after=len(client.dice_status))
    newer = await client.text_document_inline_completion_async(request(uri, second.start))
    assert items_of(await older) == []  # dropped, not an error
    assert items_of(newer) and items_of(newer)[0].range == second


async def test_automatic_request_superseded_during_its_debounce(
    client: LanguageClient, tmp_path: Path
) -> None:
    uri = open_document(client, tmp_path / "d.cu", TWO_MASKS)
    first, _ = mask_ranges(TWO_MASKS)
    older = asyncio.ensure_future(
        client.text_document_inline_completion_async(request(uri, first.start, automatic=True))
    )
    newer = asyncio.ensure_future(client.text_document_inline_completion_async(request(uri, first.start)))
    assert items_of(await older) == []
    assert items_of(await newer)


async def test_stale_version_is_dropped(client: LanguageClient, tmp_path: Path) -> None:
    text = "// another text no earlier request saw\n" + TWO_MASKS
    uri = open_document(client, tmp_path / "v.cu", text)
    first, _ = mask_ranges(text)
    pending = asyncio.ensure_future(client.text_document_inline_completion_async(request(uri, first.start)))
    await wait_status(client, "busy", after=len(client.dice_status))
    replace_document(client, uri, text.replace("scale:", "scale (edited):"), version=2)
    assert items_of(await pending) == []


async def test_accepted_item_gets_verdict_lens_and_hover(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "acc.cu", TWO_MASKS)
    first, _ = mask_ranges(TWO_MASKS)
    (item,) = items_of(
        await client.text_document_inline_completion_async(request(uri, first.start, automatic=True))
    )
    lines = TWO_MASKS.splitlines(keepends=True)
    line = lines[first.start.line]
    lines[first.start.line] = line[: first.start.character] + item.insert_text + line[first.end.character :]
    replace_document(client, uri, "".join(lines), version=2)  # what the editor does on accept
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(types.TextDocumentIdentifier(uri))
    )
    assert [(lens.range.start, lens.command.title) for lens in lenses] == [
        (first.start, "DICE: not validated")
    ]
    hover = await client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(uri), position=first.start)
    )
    assert hover is not None and "not validated" in hover.contents.value


async def test_rapid_typing_answers_every_request_and_only_the_last_runs(
    client: LanguageClient, tmp_path: Path
) -> None:
    text = "// rapid typing\n" + TWO_MASKS
    uri = open_document(client, tmp_path / "rapid.cu", text)
    first, _ = mask_ranges(text)
    origin = types.Position(line=0, character=0)
    pending = []
    for version in range(2, 102):
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(start=origin, end=origin), text="/"
                    )
                ],
            )
        )
        at = types.Position(line=first.start.line, character=first.start.character)
        pending.append(
            asyncio.ensure_future(
                client.text_document_inline_completion_async(request(uri, at, automatic=True))
            )
        )
    results = [items_of(r) for r in await asyncio.gather(*pending)]
    assert all(r == [] for r in results[:-1])  # each superseded by the next keystroke
    assert len(results[-1]) == 1 and results[-1][0].range == first


async def test_typing_the_start_of_a_suggestion_keeps_the_rest(
    client: LanguageClient, tmp_path: Path
) -> None:
    """As in Copilot: typed characters that match the suggestion shown at the cursor leave its rest shown,
    with no model call (other edits and cursor moves: `test_units.test_typing_through_shown_suggestions`).
    The server's own counters (``dice/stats``) say whether the model ran."""
    from dice.cuda_source import PositionIndex

    text = TWO_MASKS.replace("    /* <MASK:4> */\n", "    \n")
    uri = open_document(client, tmp_path / "typeahead.cu", text)
    cursor = types.Position(line=5, character=4)  # the blank line inside scale()
    (shown,) = items_of(
        await client.text_document_inline_completion_async(request(uri, cursor, automatic=True))
    )
    suggestion = shown.insert_text
    assert isinstance(suggestion, str)
    # type its first character, whatever it is (a line break too): what is left must still be shown
    assert suggestion[1:].strip(), (
        f"a suggestion of one character leaves nothing to type through: {suggestion!r}"
    )
    typed = suggestion[0]
    index = PositionIndex(text)
    at = index.position_to_byte(cursor)
    typed_text = (index.data[:at] + typed.encode() + index.data[at:]).decode()
    replace_document(client, uri, typed_text, version=2)
    after = PositionIndex(typed_text).byte_to_position(at + len(typed.encode()))
    after = types.Position(line=after.line, character=after.character)
    before = await server_stats(client)
    (rest,) = items_of(
        await client.text_document_inline_completion_async(request(uri, after, automatic=True))
    )
    assert rest.insert_text == suggestion[1:]
    assert rest.range == types.Range(start=after, end=after)
    assert rest.command.title == shown.command.title  # the label stays with the suggestion
    typed_stats = await server_stats(client)
    assert typed_stats["typed_through"] == before["typed_through"] + 1
    assert typed_stats["engine_calls"] == before["engine_calls"]  # no model call
    assert typed_stats["document_cache_hits"] == before["document_cache_hits"]  # not even the assistant

    # back to the text the suggestion was made for: the assistant answers again (from its cache)
    replace_document(client, uri, text, version=3)
    await client.text_document_inline_completion_async(request(uri, cursor, automatic=True))
    again = await server_stats(client)
    assert again["typed_through"] == typed_stats["typed_through"]
    assert again["document_cache_hits"] + again["engine_calls"] > (
        typed_stats["document_cache_hits"] + typed_stats["engine_calls"]
    )
