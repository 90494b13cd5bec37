"""Big documents: a file of 100k+ lines is parsed off the event loop (lsp_server/parse_worker.py), so other
requests, a cancel and shutdown are answered meanwhile; the result of a version that is gone is never
published; mask diagnostics and inline suggestions have caps, said once in a log message. The parse in the
worker gives exactly what ``parse_document`` gives."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from lsp_server.parse_worker import ParseWorker

from .conftest import TWO_MASKS, WAIT_S
from .test_framing import Client, stats

KERNEL = """\
__global__ void k{n}(const float* x, float* y, float a, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // the index of this thread in the grid
    if (i < n) {{
        y[i] = a * x[i] + 1.0f;  // scale and shift
    }}
    {mask}
}}

"""
DIAGNOSTICS = "textDocument/publishDiagnostics"


def big_text(lines: int = 100_000, mask_every: int = 50) -> str:
    """A kernel file of about ``lines`` lines (about 32 bytes each) with a mask in every ``mask_every``-th."""
    per = KERNEL.count("\n")
    parts = [
        KERNEL.format(n=n, mask="/* <MASK> */" if n % mask_every == 0 else "// no mask")
        for n in range(lines // per + 1)
    ]
    return "".join(parts)


def masks_in(text: str) -> int:
    return text.count("/* <MASK> */") + text.count("/* <MASK:4> */") + text.count("// <MASK:4>")


def did_open(uri: str, text: str, version: int = 1) -> dict[str, Any]:
    item = {"uri": uri, "languageId": "cuda-cpp", "version": version, "text": text}
    return {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": item}}


def code_action(msg_id: int, uri: str, line: int = 5) -> dict[str, Any]:
    at = {"line": line, "character": 8}
    params = {"textDocument": {"uri": uri}, "range": {"start": at, "end": at}, "context": {"diagnostics": []}}
    return {"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/codeAction", "params": params}


def titles(answer: dict[str, Any]) -> list[str]:
    return [action["title"] for action in answer["result"]]


def published(client: Client, uri: str) -> list[dict[str, Any]]:
    return [m["params"] for m in client.seen if m.get("method") == DIAGNOSTICS and m["params"]["uri"] == uri]


async def diagnostics_of(client: Client, uri: str, version: int) -> list[dict[str, Any]]:
    while True:
        for params in published(client, uri):
            if params.get("version") == version:
                return params["diagnostics"]
        client.seen.append(await client.read())


async def started(tmp_path) -> Client:
    client = await Client.launch()
    await client.initialize({"modelPath": str(tmp_path / "none")})
    return client


async def test_requests_are_answered_while_a_big_document_is_parsed(tmp_path) -> None:
    client = await started(tmp_path)
    small = (tmp_path / "small.cu").as_uri()
    client.send(did_open(small, TWO_MASKS))
    assert len(await diagnostics_of(client, small, 1)) == 2
    big, text = (tmp_path / "big.cu").as_uri(), big_text()
    client.send(did_open(big, text))
    client.send(code_action(1, small))  # a request on another document
    client.send(stats(2))
    client.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 999}})
    client.send(code_action(3, big, line=14))  # waits for the parse, which it shares (line 14: no mask)
    assert "DICE: Fill this mask" in titles(await client.response(1))  # the mask at line 5 of the small file
    assert "result" in await client.response(2)
    assert published(client, big) == []  # answered before the big document was even parsed
    big_titles = titles(await client.response(3))  # the big file's masks, but none at line 14
    assert "DICE: Fill this mask" not in big_titles and any("all masks" in t for t in big_titles), big_titles
    assert len(await diagnostics_of(client, big, 1)) == masks_in(text)
    assert await client.stop() == 0


async def test_shutdown_while_a_big_document_is_parsed(tmp_path) -> None:
    client = await started(tmp_path)
    big = (tmp_path / "big.cu").as_uri()
    client.send(did_open(big, big_text()))
    client.send({"jsonrpc": "2.0", "id": 1, "method": "shutdown"})
    assert (await client.response(1))["result"] is None
    assert published(client, big) == []
    client.send({"jsonrpc": "2.0", "method": "exit"})
    assert await asyncio.wait_for(client.proc.wait(), WAIT_S) == 0


async def test_a_version_that_is_gone_is_never_published(tmp_path) -> None:
    client = await started(tmp_path)
    big, first = (tmp_path / "big.cu").as_uri(), big_text()
    second = first + TWO_MASKS
    client.send(did_open(big, first))
    change = {"textDocument": {"uri": big, "version": 2}, "contentChanges": [{"text": second}]}
    client.send({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": change})
    assert len(await diagnostics_of(client, big, 2)) == masks_in(second)
    assert [p["version"] for p in published(client, big)] == [2]
    assert await client.stop() == 0


async def test_mask_diagnostics_are_capped(tmp_path) -> None:
    client = await started(tmp_path)
    uri = (tmp_path / "many.cu").as_uri()
    text = "__global__ void k(float* y) {\n" + "    // <MASK>\n" * 1500 + "}\n"
    client.send(did_open(uri, text))
    diagnostics = await diagnostics_of(client, uri, 1)
    assert len(diagnostics) == 1000 and diagnostics[-1]["range"]["start"]["line"] == 1000
    assert any("1500 masks; diagnostics show the first 1000" in text for text in client.logged())
    assert await client.stop() == 0


async def test_no_inline_suggestions_in_a_huge_file(tmp_path) -> None:
    client = await started(tmp_path)
    uri, text = (tmp_path / "huge.cu").as_uri(), big_text(lines=80_000) + TWO_MASKS
    assert len(text) > 2 * 1024 * 1024
    client.send(did_open(uri, text))
    line = text.count("\n") - TWO_MASKS.count("\n") + 5
    position = {"line": line, "character": 8}
    for msg_id in (1, 2):
        inline = {"textDocument": {"uri": uri}, "position": position, "context": {"triggerKind": 1}}
        client.send(
            {"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/inlineCompletion", "params": inline}
        )
        assert (await client.response(msg_id))["result"] == []
    said = [t for t in client.logged() if "inline suggestions are off in files over 2 MiB" in t]
    assert len(said) == 1  # once per document
    assert await client.stop() == 0


# ---------------------------------------------------------------------------------------------- the worker

ODD_TEXT = (
    "/* dice-spec\nimport torch\n*/\r\n"
    + TWO_MASKS.replace("\n", "\r\n")
    + "// <MASK:0>\n__device__ int \ud800broken() { /* <MASK:3> */ }\n"
    + "template <typename T> __global__ void t(T* p) {\n  // <MASK>\n"  # left open
)


async def test_the_worker_parses_exactly_as_parse_document() -> None:
    from dice.cuda_source import parse_document

    worker = ParseWorker()
    try:
        for text in (ODD_TEXT, big_text(lines=20_000), ""):
            doc, expected = await worker.parse(text), parse_document(text)
            assert doc == expected
            assert (
                doc.index.data == expected.index.data and doc.index.line_starts == expected.index.line_starts
            )
            assert doc.has_errors == expected.has_errors
        assert worker.starts == 1  # one child for all three
    finally:
        worker.stop()


async def test_a_cancelled_parse_stops_the_worker() -> None:
    worker = ParseWorker()
    try:
        task = asyncio.ensure_future(worker.parse(big_text(lines=200_000)))
        while worker.pid is None:
            await asyncio.sleep(0.01)
        pid = worker.pid
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(ProcessLookupError):  # killed and reaped, not left parsing
            os.kill(pid, 0)
        assert (await worker.parse(TWO_MASKS)).masks and worker.starts == 2
    finally:
        worker.stop()


# ---------------------------------------------------------------------------------------------- scans


def test_line_starts_are_found_without_scanning_the_file() -> None:
    """``in_macro_literal`` runs for every mask: it must look back over one line, not the whole file (in an
    LF-only file an unbounded rfind for a CR scanned back to the start: a file with 200k masks took 6 s
    more). No CR in the text, so each rfind scans all it is given."""
    from dice.cuda_source import parse_bytes
    from dice.cuda_source._preprocessor import in_macro_literal

    scanned: list[int] = []

    class Spy(bytes):
        def rfind(self, sub: Any, start: int = 0, end: int | None = None) -> int:  # type: ignore[override]
            found = super().rfind(sub, start, end)
            # bytes rfind scans from the end back to what it finds, or to ``start`` when it finds nothing
            scanned.append((len(self) if end is None else end) - (start if found == -1 else found))
            return found

    text = big_text(lines=5_000)
    data = Spy(text.encode())
    root = parse_bytes(bytes(data)).root_node
    for at in (len(data) // 2, len(data) - 20):
        assert not in_macro_literal(data, root, at)
    assert scanned and max(scanned) < 200


def test_inline_plan_reuses_the_documents_index(monkeypatch: pytest.MonkeyPatch) -> None:
    from lsprotocol import types

    import dice.cuda_source
    from dice.cuda_source import parse_document
    from lsp_server.inline import plan_inline

    doc = parse_document(TWO_MASKS)

    def no_new_index(text: Any) -> None:
        raise AssertionError("a new PositionIndex for the text of the parsed document")

    monkeypatch.setattr(dice.cuda_source, "PositionIndex", no_new_index)
    plan = plan_inline(TWO_MASKS, doc, types.Position(line=5, character=8))
    assert plan is not None and plan.mask_index == 0
