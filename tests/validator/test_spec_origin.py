"""Specs come only from the user: a fill that brings or changes a ``dice-spec`` is rejected before it is
compiled, and the spec run is the one parsed from the user's file before the splice."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dice.cuda_source import parse_document, splice
from dice.validator import cu
from dice.validator.cu_compile import CompileChecks
from dice.validator.spec_origin import FLAG_FILL_CHANGES_SPEC, spec_change, spec_origin
from dice.validator.verdict import Verdict

USER = """__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    /* <MASK> */
}
/* <MASK> */
/* dice-spec
import pathlib
pathlib.Path(MARKER_DIR, "user-spec-ran").write_text("1")
*/
"""

HONEST = "if (i < n) y[i] = 2.0f * x[i];"


def model_spec(marker_dir: Path) -> str:
    """A fill that carries its own spec, which would leave a marker file if it ever ran."""
    return (
        "/* dice-spec\nimport pathlib\n"
        f'pathlib.Path("{marker_dir}", "model-spec-ran").write_text("1")\n*/\n' + HONEST
    )


def user_text(marker_dir: Path) -> str:
    return USER.replace("MARKER_DIR", repr(str(marker_dir)))


def spliced(text: str, first: str, second: str = "") -> str:
    return splice(text, {0: first, 1: second}).text


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``run_cu`` in this process as if on a GPU: the compile checks pass, and the spec run executes the
    source it is given (as ``_check_spec`` does) and records it."""
    ran: list[str] = []

    def compile_checks(*args: Any) -> CompileChecks:
        return CompileChecks(checked=["NVRTC (device code)"], nvrtc=SimpleNamespace(ok=True))  # type: ignore[arg-type]

    def run_spec(ctx: Any, source: str, kernels: list[str], spec_source: str, *rest: Any) -> Any:
        ran.append(spec_source)
        exec(compile(spec_source, "spec", "exec"), {"__name__": "dice_spec"})  # noqa: S102 - the test's spec
        return Verdict("correct", True, True, message="ran"), False

    monkeypatch.setattr(cu, "run_compile_checks", compile_checks)
    monkeypatch.setattr(cu, "_run_spec", run_spec)
    return ran


def run(text: str, origin_of: str | None) -> Verdict:
    ctx = SimpleNamespace(gpu=True, phase=lambda name: None, acquire_gpu=lambda: None, task_deps=[])
    task: dict[str, Any] = {"text": text}
    if origin_of is not None:
        task["spec_origin"] = spec_origin(parse_document(origin_of)).to_json()
    verdict, _ = cu.run_cu(ctx, task)  # type: ignore[arg-type]
    return verdict


def assert_rejected(verdict: Verdict, why: str) -> None:
    assert verdict.status == "rejected", verdict.to_json()
    assert FLAG_FILL_CHANGES_SPEC in verdict.flags and FLAG_FILL_CHANGES_SPEC in verdict.message
    assert why in verdict.message and "specs come only from the user" in verdict.message
    assert not verdict.compiled


def test_a_fill_with_its_own_spec_is_rejected_and_never_run(tmp_path: Path, in_process: list[str]) -> None:
    user = user_text(tmp_path)
    # the model's block comes first in the spliced file: it is the spec a re-parse would pick
    text = spliced(user, model_spec(tmp_path))
    assert "model-spec-ran" in (parse_document(text).spec.source or "")
    assert_rejected(run(text, user), "adds 1 'dice-spec' marker")
    assert in_process == []
    assert not (tmp_path / "model-spec-ran").exists()
    assert not (tmp_path / "user-spec-ran").exists()


def test_a_fill_that_comments_out_the_users_spec_is_rejected(tmp_path: Path, in_process: list[str]) -> None:
    user = user_text(tmp_path)
    # the second hole opens a comment that swallows the spec's opening: the spec is no longer a comment
    verdict = run(spliced(user, HONEST, "/* a note"), user)
    assert_rejected(verdict, "hide the user's dice-spec block")
    # a string left open by the first hole's fill and a comment closed: the spec block is not the user's
    assert_rejected(run(spliced(user, HONEST, "/* x */ /*"), user), "hide the user's dice-spec block")
    assert in_process == []


def test_a_fill_that_puts_the_spec_under_if_0_is_rejected(tmp_path: Path, in_process: list[str]) -> None:
    user = user_text(tmp_path) + "#endif\n"
    user = user.replace("/* <MASK> */\n/* dice-spec", "/* <MASK> */\n#if 1\n/* dice-spec")
    assert spec_change(spec_origin(parse_document(user)), parse_document(spliced(user, HONEST))) is None
    text = spliced(user, HONEST, "#if 0")
    assert_rejected(run(text, user), "preprocessor construct (preproc_if 0)")
    assert in_process == []


def test_an_honest_fill_runs_the_users_spec(tmp_path: Path, in_process: list[str]) -> None:
    user = user_text(tmp_path)
    verdict = run(spliced(user, HONEST), user)
    assert verdict.status == "correct", verdict.to_json()
    assert in_process == [parse_document(user).spec.source]
    assert (tmp_path / "user-spec-ran").exists()


def test_the_spec_run_is_the_users_even_when_the_texts_agree(tmp_path: Path, in_process: list[str]) -> None:
    # the worker runs the source the caller parsed before the splice, not one read from the spliced text
    user = user_text(tmp_path)
    origin = spec_origin(parse_document(user))
    text = spliced(user, HONEST)
    task = {"text": text, "spec_origin": origin.to_json()}
    assert cu.spec_to_run(task, parse_document(text)) == origin.source
    assert cu.spec_to_run({"text": text}, parse_document(text)) == parse_document(text).spec.source


def test_a_second_marker_is_rejected_even_when_the_first_spec_stays(tmp_path: Path) -> None:
    user = user_text(tmp_path)
    origin = spec_origin(parse_document(user))
    text = spliced(user, HONEST, "// dice-spec")
    assert parse_document(text).spec.source == origin.source  # the first spec is still the user's
    assert "adds 1" in (spec_change(origin, parse_document(text)) or "")
    assert spec_change(origin, parse_document(spliced(user, HONEST))) is None


def test_the_pool_rejects_before_validating(tmp_path: Path, cpu_pool: Any) -> None:
    user = user_text(tmp_path)
    origin = spec_origin(parse_document(user))
    own = cpu_pool.submit_cu(spliced(user, model_spec(tmp_path)), spec_origin=origin)
    assert own.done()  # refused at the boundary: no worker saw it
    assert_rejected(own.result(), "adds 1 'dice-spec' marker")
    hidden = cpu_pool.validate_cu(spliced(user, HONEST, "/* a note"), spec_origin=origin)
    assert_rejected(hidden, "hide the user's dice-spec block")
    honest = cpu_pool.validate_cu(spliced(user, HONEST), spec_origin=origin)
    assert honest.status != "rejected", honest.to_json()
    assert FLAG_FILL_CHANGES_SPEC not in honest.flags
