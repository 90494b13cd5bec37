"""Workspace trust: in an untrusted workspace (the default of ``dice.trustedWorkspace``; VS Code sends its own
``workspace.isTrusted``) the server validates compile-only. No dice-spec, KernelBench reference or candidate
is run, and the verdict says so; once trusted, validation is what it was."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from dice.assistant.request import Request
from dice.assistant.rules import code_run_refusal
from dice.assistant.settings import AssistantSettings
from dice.assistant.validation import Validation
from dice.validator.verdict import FLAG_NOT_RUN, FLAG_NOT_TRUSTED, Verdict, verdict_label

from .conftest import init_params, model_options, open_document, server_config, wait_for, wait_status

ASYNC = pytest.mark.asyncio(loop_scope="module")


def spec_kernel(marker: Path) -> str:
    """A kernel whose dice-spec, if it were ever executed, writes ``marker`` at once."""
    return f"""\
__global__ void scale(const float* x, float* y, float a, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}}

/* dice-spec
from pathlib import Path
Path({str(marker)!r}).write_text("the spec ran")

import torch

def inputs():
    return [torch.randn(256, device="cuda"), torch.empty(256, device="cuda"), 2.0, 256]

def reference(x, y, a, n):
    return a * x

def launch(module, x, y, a, n):
    return y
*/
"""


# ------------------------------------------------------------------------------------ the gate itself
def test_the_rule_refuses_untrusted_and_allows_trusted() -> None:
    assert code_run_refusal(True) is None
    refusal = code_run_refusal(False)
    assert refusal is not None and refusal.startswith("workspace not trusted")


def test_the_editor_default_is_untrusted_and_the_command_line_trusts_its_own_file() -> None:
    from dice.cli import build_parser
    from dice.commands.console import settings_from_args

    assert AssistantSettings().trusted_workspace is False
    args = build_parser().parse_args(["complete", "x.cu"])
    assert settings_from_args(args).trusted_workspace is True


class RecordingPool:
    """Answers every task at once with a compile-only verdict and records what it was asked to run."""

    def __init__(self) -> None:
        self.cu: list[dict] = []
        self.kernelbench: list[dict] = []

    @staticmethod
    def _done() -> concurrent.futures.Future[Verdict]:
        future: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
        future.set_result(Verdict("compiled", True, flags=[FLAG_NOT_RUN]))
        return future

    def submit_cu(self, text: str, **kwargs: object) -> concurrent.futures.Future[Verdict]:
        self.cu.append(kwargs)
        return self._done()

    def submit_kernelbench(self, ref: str, cand: str, **kwargs: object) -> concurrent.futures.Future[Verdict]:
        self.kernelbench.append(kwargs)
        return self._done()


@ASYNC
@pytest.mark.parametrize("trusted", [False, True])
async def test_every_validation_path_passes_the_refusal_down(trusted: bool) -> None:
    pool = RecordingPool()
    validation = Validation(pool, cache_size=8, stats={"validations": 0})  # type: ignore[arg-type]
    validation.trusted = trusted
    request = Request(asyncio.get_running_loop(), None, None, 0)
    await validation.document("__global__ void k() {}\n", run=True, filename=None)
    await validation.texts(
        request, ["__global__ void k() {}\n"], level="run", filename=None, done_before=0, total=1
    )
    await validation.programs(request, "ref", ["cand"], timing=True)
    expected = None if trusted else code_run_refusal(False)
    assert [kw["not_run"] for kw in pool.cu] == [expected, expected]
    assert [kw["not_run"] for kw in pool.kernelbench] == [expected]


def test_the_label_says_the_workspace_is_not_trusted() -> None:
    verdict = Verdict("compiled", True, flags=[FLAG_NOT_RUN, FLAG_NOT_TRUSTED])
    assert verdict_label(verdict) == "compiled ✓ · not run: workspace not trusted"
    assert "correct" not in verdict_label(verdict)


# ------------------------------------------------------------------------------------ through the server
@pytest_lsp.fixture(scope="module", config=server_config())
async def client(lsp_client: LanguageClient, tiny_model: Path):
    # no trustedWorkspace: the safe default
    await lsp_client.initialize_session(init_params(model_options(tiny_model, validationLevel="run")))
    await wait_status(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


def execute(command: str, *arguments: object) -> types.ExecuteCommandParams:
    return types.ExecuteCommandParams(command=command, arguments=list(arguments))


async def set_trusted(client: LanguageClient, model: Path, trusted: bool) -> None:
    mark = len(client.log_messages)
    options = model_options(model, validationLevel="run", trustedWorkspace=trusted)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"dice": options}))
    await wait_for(
        client,
        types.WINDOW_LOG_MESSAGE,
        lambda: any(m.message.startswith("settings applied") for m in client.log_messages[mark:]),
    )


@ASYNC
async def test_an_untrusted_workspace_never_runs_its_spec(client: LanguageClient, tmp_path: Path) -> None:
    marker = tmp_path / "spec-ran.txt"
    uri = open_document(client, tmp_path / "spec.cu", spec_kernel(marker))
    result = await client.workspace_execute_command_async(execute("dice.validateKernel", uri))
    assert result["ok"]
    verdict = result["verdict"]
    assert verdict["status"] == "compiled" and verdict["compiled"] is True and verdict["correct"] is None
    assert FLAG_NOT_TRUSTED in verdict["flags"]
    assert "Not run: workspace not trusted" in verdict["message"]
    assert result["label"] == "compiled ✓ · not run: workspace not trusted"
    assert not marker.exists()


@ASYNC
async def test_a_trusted_workspace_validates_as_before(
    client: LanguageClient, tiny_model: Path, tmp_path: Path
) -> None:
    await set_trusted(client, tiny_model, True)
    try:
        uri = open_document(client, tmp_path / "spec.cu", spec_kernel(tmp_path / "spec-ran.txt"))
        result = await client.workspace_execute_command_async(execute("dice.validateKernel", uri))
        verdict = result["verdict"]
        assert FLAG_NOT_TRUSTED not in verdict["flags"]
        assert "not trusted" not in verdict["message"] and "not trusted" not in result["label"]
        if verdict["status"] == "compiled":  # this machine has no GPU: the spec could not run here
            assert "no CUDA GPU" in verdict["message"]
    finally:
        await set_trusted(client, tiny_model, False)


def test_a_kernelbench_program_is_only_checked_statically_and_says_why() -> None:
    from dice.validator.guards import analyze_candidate
    from dice.validator.kbstatic import static_compile_check

    info = analyze_candidate("import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n")
    verdict = static_compile_check(info, False, not_run=code_run_refusal(False))
    assert verdict.status == "compiled" and verdict.correct is None
    assert verdict.flags == [FLAG_NOT_RUN, FLAG_NOT_TRUSTED]
    assert verdict.message.startswith("compiled (not run: workspace not trusted")
    assert FLAG_NOT_TRUSTED not in static_compile_check(info, False).flags  # no GPU alone: as before
