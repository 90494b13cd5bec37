"""Real CUDA projects (``../shared/data/realproj``, copied to a temporary folder with its compile commands):
unmodified files compile, a fill equal to the original statement compiles, a garbage statement is a
compile error on its own line, headers borrow an including file's command.

Each check is a real nvcc compile (1-20 s here): the default run keeps to the fastest translation units; the
ones marked ``slow`` cover the rest of the projects (``pytest -m slow``), and
``benchmarks/realproj_compile.py`` measures all of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dice.cuda_source import parse_document
from dice.validator import ValidatorPool
from dice.validator.paths import nvcc_path

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")

LEARN = "PacktPublishing+Learn-CUDA-Programming/Chapter07/07_parallel_programming_pattern"
FAST_TUS = [
    f"{LEARN}/03_scan/scan.cu",
    f"{LEARN}/04_pack_n_split/pack_n_split.cu",  # includes "../03_scan/scan_v2.cu"
    f"{LEARN}/05_n-body/n_body.cu",
    "NVIDIA+CUDALibrarySamples/cuBLAS/Level-1/dot/cublas_dot_example.cu",  # cublas_v2.h from the pip headers
]
SLOW_TUS = [
    "ggml-org+ggml/src/ggml-cuda/arange.cu",
    "ggml-org+ggml/src/ggml-cuda/norm.cu",
    "moderngpu+moderngpu/tutorial/tut_01_transform.cu",
    "PacktPublishing+Learn-CUDA-Programming/Chapter03/03_cuda_thread_programming/08_cooperative_group/reduction_cg_kernel.cu",
]
GARBAGE = "int dice_garbage = ;"


def statement_lines(text: str, kind: str) -> list[int]:
    """0-based lines holding one whole statement inside the body of a function of ``kind``."""
    lines = text.splitlines()
    doc = parse_document(text)
    out: list[int] = []
    for f in doc.functions:
        if f.kind != kind:
            continue
        first, last = (
            doc.index.line_of_byte(f.body_start_byte) + 1,
            doc.index.line_of_byte(f.body_end_byte) - 1,
        )
        for n in range(first, last + 1):
            s = lines[n].strip()
            if (
                s.endswith(";")
                and not s.startswith(("#", "//", "for", "}"))
                and not lines[n - 1].rstrip().endswith("\\")
            ):
                out.append(n)
    return out


def _validate(pool: ValidatorPool, path: Path, text: str | None = None):
    return pool.validate_cu(
        path.read_text() if text is None else text, filename=path.name, folder=path.parent
    )


def _replace_line(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    indent = lines[line][: len(lines[line]) - len(lines[line].lstrip())]
    lines[line] = indent + new + "\n"
    return "".join(lines)


def _with_comment(text: str, line: int) -> str:
    """The original statement as a fill: the same code, a different text (no cached verdict)."""
    lines = text.splitlines(keepends=True)
    lines[line] = lines[line].rstrip("\r\n") + " /* fill */\n"
    return "".join(lines)


@pytest.mark.parametrize("tu", FAST_TUS)
def test_unmodified_translation_units_compile_with_their_command(
    cpu_pool: ValidatorPool, realproj: Path, tu: str
) -> None:
    v = _validate(cpu_pool, realproj / tu)
    assert v.status == "compiled", v.log
    assert "whole file with nvcc (compile_commands.json entry" in v.message


@pytest.mark.slow
@pytest.mark.parametrize("tu", SLOW_TUS)
def test_unmodified_translation_units_compile_slow(cpu_pool: ValidatorPool, realproj: Path, tu: str) -> None:
    v = _validate(cpu_pool, realproj / tu)
    assert v.status == "compiled", v.log


@pytest.mark.parametrize("kind", ["global", "host"])
def test_original_statement_compiles_and_garbage_is_caught_on_its_line(
    cpu_pool: ValidatorPool, realproj: Path, kind: str
) -> None:
    path = realproj / LEARN / "05_n-body/n_body.cu"
    text = path.read_text()
    line = statement_lines(text, kind)[0]
    original = _validate(cpu_pool, path, _with_comment(text, line))
    assert original.status == "compiled", original.log
    garbage = _validate(cpu_pool, path, _replace_line(text, line, GARBAGE))
    assert garbage.status == "compile_error"
    assert garbage.diagnostics[0]["line"] == line and garbage.diagnostics[0]["source"] == "nvcc"
    assert garbage.message.startswith(f"n_body.cu({line + 1}): error")


def test_a_header_is_validated_with_a_borrowed_command(cpu_pool: ValidatorPool, realproj: Path) -> None:
    header = realproj / LEARN / "03_scan/scan.h"
    v = _validate(cpu_pool, header)
    assert v.status == "compiled", v.log
    assert "borrowed from scan.cu (includes it)" in v.message
    text = header.read_text()
    line = text.splitlines().index("void scan_v1(float *d_output, float *d_input, int length);")
    bad = _validate(cpu_pool, header, _replace_line(text, line, GARBAGE))
    assert bad.status == "compile_error" and bad.diagnostics[0]["line"] == line


@pytest.mark.slow
def test_a_ggml_header_and_a_template_kernel_body(cpu_pool: ValidatorPool, realproj: Path) -> None:
    header = realproj / "ggml-org+ggml/src/ggml-cuda/arange.cuh"
    v = _validate(cpu_pool, header)
    assert v.status == "compiled" and "borrowed from arange.cu (includes it)" in v.message, v.log
    path = realproj / "ggml-org+ggml/src/ggml-cuda/norm.cu"
    text = path.read_text()
    line = statement_lines(text, "global")[0]
    bad = _validate(cpu_pool, path, _replace_line(text, line, GARBAGE))
    assert bad.status == "compile_error" and bad.diagnostics[0]["line"] == line
