"""Diagnostics: masks as information (exact payload), compile errors of "Validate this kernel" on the right
file line (through device-code extraction, with host code above the error), cleared on close."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import (
    TWO_MASKS,
    init_params,
    mask_ranges,
    open_document,
    replace_document,
    server_config,
    wait_diagnostics,
    wait_status,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

HINT = "accept a suggestion or run “DICE: Fill this mask”"

BROKEN_KERNEL = """\
#include <cuda_runtime.h>
#include <cstdio>

int host_main() {
    float* d = nullptr;
    cudaMalloc(&d, 16);
    return 0;
}

__global__ void broken(float* y, int n) {
    int i = threadIdx.x;
    y[i] = undefined_name * 2.0f;
}
"""


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    # No usable model: masks and validation must not need one.
    missing = tmp_path_factory.mktemp("none") / "no-model"
    await lsp_client.initialize_session(
        init_params({"modelPath": str(missing), "validationLevel": "compile"})
    )
    await wait_status(lsp_client, "error")
    yield
    await lsp_client.shutdown_session()


async def test_masks_are_information_diagnostics(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "two.cu", TWO_MASKS)
    got = await wait_diagnostics(client, uri, lambda d: len(d) == 2)
    first, second = mask_ranges(TWO_MASKS)
    # line 5 is after "é, 𝄞": the UTF-16 column of the mask is exact
    assert first == types.Range(start=types.Position(5, 4), end=types.Position(5, 18))
    assert got == [
        types.Diagnostic(
            range=first,
            message=f"DICE mask #0 in global function `scale`, up to 4 tokens: {HINT}",
            severity=types.DiagnosticSeverity.Information,
            code="mask",
            source="dice",
        ),
        types.Diagnostic(
            range=second,
            message=f"DICE mask #1 in device function `square`, up to 4 tokens: {HINT}",
            severity=types.DiagnosticSeverity.Information,
            code="mask",
            source="dice",
        ),
    ]
    # an edit that removes one mask updates the diagnostics
    replace_document(client, uri, TWO_MASKS.replace("// <MASK:4>", "return v * v;"), version=2)
    got = await wait_diagnostics(client, uri, lambda d: len(d) == 1)
    assert got[0].range == first

    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    await wait_diagnostics(client, uri, lambda d: d == [])


async def test_malformed_masks_are_warnings(client: LanguageClient, tmp_path: Path) -> None:
    """``<MASK:0>`` was ignored without a word; now the user learns why it is not filled."""
    text = "__global__ void k(float* y) {\n    /* <MASK:0> */\n}\n"
    uri = open_document(client, tmp_path / "bad.cu", text)
    (got,) = await wait_diagnostics(client, uri, lambda d: len(d) == 1)
    assert got.severity == types.DiagnosticSeverity.Warning and got.code == "malformed-mask"
    assert got.range == types.Range(start=types.Position(1, 4), end=types.Position(1, 18))
    assert "positive integer" in got.message


async def test_compile_errors_map_to_file_lines(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "broken.cu", BROKEN_KERNEL)
    await wait_diagnostics(client, uri, lambda d: True)
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="dice.validateKernel", arguments=[uri])
    )
    assert result["ok"] is True
    assert result["verdict"]["status"] == "compile_error" and result["label"] == "compiled ✗"
    got = await wait_diagnostics(client, uri, lambda d: any(x.code == "compile" for x in d))
    errors = [d for d in got if d.code == "compile"]
    assert [d.range.start.line for d in errors] == [11]  # `y[i] = undefined_name * 2.0f;`
    assert "undefined_name" in errors[0].message
    assert errors[0].severity == types.DiagnosticSeverity.Error
    # from the compiler's column (`undefined_name`) to the end of the line, labelled with its tool
    assert errors[0].range == types.Range(start=types.Position(11, 11), end=types.Position(11, 33))
    assert errors[0].source in ("dice (nvcc)", "dice (nvrtc)")
    assert any("compiled ✗" in m.message for m in client.messages)
