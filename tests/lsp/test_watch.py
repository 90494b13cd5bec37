"""watchdog: a dice-spec's reference module or a KernelBench reference beside the .cu changing on disk
re-validates the file; the model folder changing reloads the model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import pytest_lsp
from pytest_lsp import LanguageClient

from .conftest import init_params, model_options, open_document, server_config, wait_diagnostics, wait_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

SPEC_KERNEL = """\
/* dice-spec
import torch
from ref_scale import reference

def inputs():
    return [torch.randn(256, device="cuda"), 2.0]

def launch(module, x, a):
    y = torch.empty_like(x)
    module.get_function("scale")((1,), (256,), (x, y, numpy.float32(a), numpy.int32(x.numel())))
    return y
*/
__global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    model = tmp_path_factory.mktemp("watched") / "model"
    shutil.copytree(tiny_model, model)
    await lsp_client.initialize_session(init_params(model_options(model, validationLevel="compile")))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


async def test_reference_module_change_revalidates(client: LanguageClient, tmp_path: Path) -> None:
    (tmp_path / "ref_scale.py").write_text("def reference(x, a):\n    return a * x\n")
    uri = open_document(client, tmp_path / "scale.cu", SPEC_KERNEL)
    await wait_diagnostics(client, uri, lambda d: d == [])  # published: the watch is registered
    mark = len(client.dice_status)
    (tmp_path / "ref_scale.py").write_text("def reference(x, a):\n    return a * x + 0\n")
    validating = await wait_status(client, "validating", after=mark)
    assert validating["message"] == "re-validating scale.cu"
    await wait_status(client, "ready", after=mark)
    assert any("ref_scale.py changed on disk" in m.message for m in client.log_messages)

    # a KernelBench reference appearing beside the file counts too
    mark = len(client.dice_status)
    (tmp_path / "scale.py").write_text("import torch\n")
    await wait_status(client, "validating", after=mark)


async def test_model_folder_change_reloads(client: LanguageClient) -> None:
    loading = next(s for s in client.dice_status if s["state"] == "loading")
    folder = Path(loading["message"].removeprefix("loading "))
    mark = len(client.dice_status)
    (folder / "loss_curve.csv").write_text("step,loss\n1,2.0\n")  # not part of the model: ignored
    config = folder / "config.json"
    config.write_text(config.read_text())  # a checkpoint rewritten in place
    reloading = await wait_status(client, "loading", after=mark)
    assert reloading["message"] == f"loading {folder}"
    await wait_status(client, "ready", after=mark)
    changed = [m.message for m in client.log_messages if "model folder changed" in m.message]
    assert changed and all("config.json" in m for m in changed)
