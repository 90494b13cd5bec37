"""Code actions and commands: fill all masks / fill this mask through versioned workspace/applyEdit with
work-done progress, verdict lenses on the filled regions, refusal to write non-compiling fills, generate a
kernel from a KernelBench reference into a new file, and validate a kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import (
    KERNELBENCH_REF,
    TWO_MASKS,
    action_commands,
    apply_text_edits,
    init_params,
    mask_ranges,
    model_options,
    open_document,
    replace_document,
    server_config,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

GOOD_KERNEL = """\
__global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    await lsp_client.initialize_session(init_params(model_options(tiny_model)))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


def execute(command: str, *arguments: object, token: str | None = None) -> types.ExecuteCommandParams:
    return types.ExecuteCommandParams(command=command, arguments=list(arguments), work_done_token=token)


def only_text_edits(params: types.ApplyWorkspaceEditParams, uri: str, version: int) -> list[types.TextEdit]:
    (change,) = params.edit.document_changes
    assert isinstance(change, types.TextDocumentEdit)
    assert change.text_document.uri == uri and change.text_document.version == version
    return list(change.edits)


async def test_code_actions(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "a.cu", TWO_MASKS)
    _, second = mask_ranges(TWO_MASKS)
    params = types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=second,
        context=types.CodeActionContext(diagnostics=[]),
    )
    at = {"line": second.start.line, "character": second.start.character}
    assert action_commands(await client.text_document_code_action_async(params)) == [
        ("DICE: Fill this mask", "dice.fillMask", [uri, at]),
        ("DICE: Fill all masks (2)", "dice.fillAllMasks", [uri]),
        ("DICE: Validate this kernel", "dice.validateKernel", [uri]),
    ]
    params.context = types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.Source])
    assert [c[1] for c in action_commands(await client.text_document_code_action_async(params))] == [
        "dice.fillAllMasks",
        "dice.validateKernel",
    ]
    ref = open_document(client, tmp_path / "ref.py", KERNELBENCH_REF, language="python")
    params.text_document = types.TextDocumentIdentifier(uri=ref)
    params.context = types.CodeActionContext(diagnostics=[])
    assert action_commands(await client.text_document_code_action_async(params)) == [
        ("DICE: Generate CUDA kernel from this PyTorch reference", "dice.generateKernel", [ref])
    ]


async def test_fill_all_masks_applies_versioned_edits_with_progress(
    client: LanguageClient, tmp_path: Path
) -> None:
    uri = open_document(client, tmp_path / "fill.cu", TWO_MASKS)
    client.progress_reports["fill-all"] = []
    result = await client.workspace_execute_command_async(execute("dice.fillAllMasks", uri, token="fill-all"))
    assert result["ok"] and result["applied"] and result["skipped"] == []
    assert [f["mask"] for f in result["filled"]] == [0, 1]
    edits = only_text_edits(client.applied_edits[-1], uri, 1)
    new_text = apply_text_edits(TWO_MASKS, edits)
    # each mask comment replaced by its fill; every other byte unchanged
    first, second = (f["text"] for f in result["filled"])
    assert new_text == TWO_MASKS.replace("/* <MASK:4> */", first, 1).replace("// <MASK:4>", second, 1)

    reports = client.progress_reports["fill-all"]
    assert isinstance(reports[0], types.WorkDoneProgressBegin)
    assert reports[0].title == "DICE: filling 2 mask(s)" and reports[0].cancellable
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and reports[-1].message == "done"
    assert any(isinstance(r, types.WorkDoneProgressReport) and r.percentage == 100 for r in reports)

    # the editor applies the edit; the filled regions carry their verdict
    replace_document(client, uri, new_text, version=2)
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(types.TextDocumentIdentifier(uri))
    )
    starts = [r.start for r in mask_ranges(TWO_MASKS)]
    assert sorted((lens.range.start.line, lens.command.title) for lens in lenses) == [
        (starts[0].line, "DICE: not validated"),
        (starts[1].line, "DICE: not validated"),
    ]


async def test_fill_this_mask_only_touches_that_mask(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "one.cu", TWO_MASKS)
    _, second = mask_ranges(TWO_MASKS)
    at = {"line": second.start.line, "character": second.start.character + 3}
    result = await client.workspace_execute_command_async(execute("dice.fillMask", uri, at))
    assert result["applied"] and [f["mask"] for f in result["filled"]] == [1]
    new_text = apply_text_edits(TWO_MASKS, only_text_edits(client.applied_edits[-1], uri, 1))
    assert new_text == TWO_MASKS.replace("// <MASK:4>", result["filled"][0]["text"])


async def test_fills_that_do_not_compile_are_not_written(
    client: LanguageClient, tmp_path: Path, tiny_model: Path
) -> None:
    compile_checked = {"dice": model_options(tiny_model, validationLevel="compile")}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=compile_checked))
    uri = open_document(client, tmp_path / "nc.cu", "// compile-checked\n" + TWO_MASKS)
    before = len(client.applied_edits)
    result = await client.workspace_execute_command_async(execute("dice.fillAllMasks", uri))
    # The random tiny model writes bytes, not CUDA: nothing compiles, so nothing is written.
    assert result["ok"] and not result["applied"]
    assert [s["mask"] for s in result["skipped"]] == [0, 1]
    assert all(s["reason"] == "compiled ✗" for s in result["skipped"])
    assert len(client.applied_edits) == before
    assert any("left unfilled" in m.message for m in client.messages)
    back = {"dice": model_options(tiny_model)}
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=back))


async def test_generate_kernel_writes_a_new_file(
    client: LanguageClient, tmp_path: Path, tiny_model: Path
) -> None:
    # one sample: a whole-program prompt is long for a CPU test
    one = {"dice": model_options(tiny_model, candidates=1)}
    mark = len(client.log_messages)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=one))
    await wait_for(client, types.WINDOW_LOG_MESSAGE, lambda: len(client.log_messages) > mark)
    ref_path = tmp_path / "add.py"
    ref_path.write_text(KERNELBENCH_REF)
    uri = open_document(client, ref_path, KERNELBENCH_REF, language="python")
    client.progress_reports["gen"] = []
    result = await client.workspace_execute_command_async(execute("dice.generateKernel", uri, token="gen"))
    assert result["ok"], result
    out = tmp_path / "add_dice.py"
    assert result["path"] == str(out) and result["uri"] == out.as_uri()
    create, insert = client.applied_edits[-1].edit.document_changes
    assert isinstance(create, types.CreateFile) and create.uri == out.as_uri()
    assert create.options.overwrite is False
    (edit,) = insert.edits
    assert edit.new_text.startswith(
        "# Generated by DICE from add.py with lsp-dice-tiny0.\n# Verdict: not validated\n"
        "# Verdict JSON: null\n"
    )
    assert not out.exists()  # the client (here: the test) creates it, in its own undo history
    assert client.progress_reports["gen"][-1].message == "done"

    not_a_reference = open_document(client, tmp_path / "plain.py", "print('hi')\n", language="python")
    result = await client.workspace_execute_command_async(execute("dice.generateKernel", not_a_reference))
    assert result == {
        "ok": False,
        "message": "plain.py: not a KernelBench-format reference: it does not define Model, get_inputs, "
        "get_init_inputs",
    }


async def test_validate_kernel(client: LanguageClient, tmp_path: Path) -> None:
    uri = open_document(client, tmp_path / "good.cu", GOOD_KERNEL)
    result = await client.workspace_execute_command_async(execute("dice.validateKernel", uri))
    assert result["ok"] and result["verdict"]["compiled"] is True
    # no dice-spec and no GPU here: compiled, not run
    assert result["verdict"]["status"] == "compiled" and result["label"] == "compiled ✓ · not run"
    await wait_for(
        client,
        types.WINDOW_SHOW_MESSAGE,
        lambda: any("good.cu: compiled ✓" in m.message for m in client.messages),
    )
