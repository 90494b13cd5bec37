"""On a GPU: a verdict that rests on a dice-spec's sibling module changes when that module changes on disk.

The spec imports its reference from ``ref_scale.py`` beside the ``.cu`` file (the validator worker imports
it from the file's own folder, afresh for every task). Before the fix, the reference could not be imported
at all (the worker ran in a temporary folder), and after a change the server kept serving the cached verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import init_params, model_options, open_document, server_config, wait_for, wait_status

pytestmark = [pytest.mark.gpu, pytest.mark.asyncio(loop_scope="module")]

SPEC_KERNEL = """\
/* dice-spec
import numpy
import torch
from ref_scale import reference

def inputs():
    return [torch.randn(4096, device="cuda"), 2.0]

def launch(module, x, a):
    y = torch.empty_like(x)
    grid = ((x.numel() + 255) // 256,)
    module.get_function("scale")(grid, (256,), (x, y, numpy.float32(a), numpy.int32(x.numel())))
    return y
*/
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    await lsp_client.initialize_session(
        init_params(model_options(tiny_model, validationLevel="run", trustedWorkspace=True))
    )
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


async def validate(client: LanguageClient, uri: str) -> dict:
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="dice.validateKernel", arguments=[uri])
    )
    assert result["ok"], result
    return result


async def test_verdict_follows_the_watched_reference_module(client: LanguageClient, tmp_path: Path) -> None:
    reference = tmp_path / "ref_scale.py"
    reference.write_text("def reference(x, a):\n    return a * x\n")
    uri = open_document(client, tmp_path / "scale.cu", SPEC_KERNEL)
    first = await validate(client, uri)
    assert first["verdict"]["status"] == "correct", first["verdict"]["message"]

    mark = len(client.log_messages)
    reference.write_text("def reference(x, a):\n    return a * x + 1.0\n")  # the kernel is now wrong
    await wait_for(
        client,
        types.WINDOW_LOG_MESSAGE,
        lambda: any(m.message.startswith("re-validated scale.cu") for m in client.log_messages[mark:]),
    )
    revalidated = next(m.message for m in client.log_messages[mark:] if m.message.startswith("re-validated"))
    assert "correct ✗" in revalidated

    second = await validate(client, uri)  # asked again: no stale verdict from any cache
    assert second["verdict"]["status"] == "incorrect"

    # and back: asked at once, before the watcher has even noticed, the verdict is not stale either
    reference.write_text("def reference(x, a):\n    return a * x\n")
    third = await validate(client, uri)
    assert third["verdict"]["status"] == "correct"
