"""The whole file compiled with nvcc as if it were the user's file, through the pool (small files, CPU)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dice.validator import ValidatorPool
from dice.validator.build_flags import BuildOptions
from dice.validator.paths import cuda_include_dirs, nvcc_path, pip_cuda_include_dir, toolkit_include_dir

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")

TEMPLATE_ONLY_HOST_USES = """#include <cstdio>
template <typename T>
__global__ void scale(T* x, T s) {
    x[threadIdx.x] *= s;
}

int main() {
    scale<float><<<1, 32>>>(nullptr, 2.f);
    return 0;
}
"""


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """proj/common.h, proj/kernels/{local.cuh, k.cu}: relative includes both ways."""
    (tmp_path / "proj" / "kernels").mkdir(parents=True)
    (tmp_path / "proj" / "common.h").write_text("#pragma once\n#define FACTOR 2.0f\n")
    local = '#pragma once\n#include "../common.h"\n'
    local += "__device__ inline float twice(float v) { return v * FACTOR; }\n"
    (tmp_path / "proj" / "kernels" / "local.cuh").write_text(local)
    return tmp_path / "proj" / "kernels"


def test_relative_includes_resolve_as_in_place_and_nothing_is_written_there(
    cpu_pool: ValidatorPool, project: Path
) -> None:
    text = (
        '#include "local.cuh"\n#include "../common.h"\n__global__ void k(float* x) { x[0] = twice(x[0]); }\n'
    )
    text += "int main() { k<<<1, 1>>>(nullptr); return 0; }\n"
    before = _tree(project.parent)
    v = cpu_pool.validate_cu(text, filename="k.cu", folder=project)
    assert v.status == "compiled", v.log
    assert v.message.startswith("compiled: whole file with nvcc (no compile command: ")
    assert "device code with NVRTC" in v.message
    assert _tree(project.parent) == before


def test_host_errors_land_on_the_users_line_and_never_name_the_temporary_file(
    cpu_pool: ValidatorPool, project: Path
) -> None:
    text = "#include <cstdio>\n__global__ void k() {}\nint main() {\n    return undefined_host;\n}\n"
    v = cpu_pool.validate_cu(text, filename="host.cu", folder=project)
    assert v.status == "compile_error"
    assert v.message.startswith('host.cu(4): error: identifier "undefined_host" is undefined')
    assert [(d["line"], d["source"], d["column"]) for d in v.diagnostics] == [(3, "nvcc", 11)]
    assert "nvcc-" not in v.log and "task" not in v.message and str(project) not in v.message


def test_a_template_only_host_code_instantiates_is_checked_by_nvcc(
    cpu_pool: ValidatorPool, project: Path
) -> None:
    good = cpu_pool.validate_cu(TEMPLATE_ONLY_HOST_USES, filename="t.cu", folder=project)
    assert good.status == "compiled" and good.unchecked == []
    bad = TEMPLATE_ONLY_HOST_USES.replace("x[threadIdx.x] *= s;", "for for for ;")
    v = cpu_pool.validate_cu(bad, filename="t.cu", folder=project)
    assert v.status == "compile_error" and v.diagnostics[0]["line"] == 3  # then the cascade at "}"
    typed = TEMPLATE_ONLY_HOST_USES.replace("x[threadIdx.x] *= s;", "x[0].nothing();")
    v = cpu_pool.validate_cu(typed, filename="t.cu", folder=project)
    assert v.status == "compile_error" and v.diagnostics[0]["line"] == 3
    assert any("instantiation" in n for n in v.diagnostics[0]["notes"])


def test_an_error_in_a_header_lands_on_its_include(cpu_pool: ValidatorPool, project: Path) -> None:
    (project / "broken.cuh").write_text("#pragma once\n__device__ inline int broken() { return nope; }\n")
    text = '// a kernel\n#include "broken.cuh"\n__global__ void k(int* x) { x[0] = broken(); }\n'
    v = cpu_pool.validate_cu(text, filename="h.cu", folder=project)
    assert v.status == "compile_error"
    (diag,) = [d for d in v.diagnostics if d["severity"] == "error"]
    assert diag["line"] == 1 and diag["header"]["line"] == 1 and diag["header"]["path"].endswith("broken.cuh")
    assert "included at line 2" in diag["message"]


def test_inline_ptx_errors_are_caught_on_their_line(cpu_pool: ValidatorPool, project: Path) -> None:
    text = (
        '__global__ void k(int x, int* y) {\n  y[0] = x;\n  asm volatile("bogus.instr %0;" :: "r"(x));\n}\n'
    )
    text += "int main() { k<<<1, 1>>>(0, nullptr); return 0; }\n"
    v = cpu_pool.validate_cu(text, filename="ptx.cu", folder=project)
    assert v.status == "compile_error" and {d["line"] for d in v.diagnostics} == {2}, v.log


def test_unchanged_checks_are_cache_hits_and_an_edited_header_is_not_served_stale(
    cpu_pool: ValidatorPool, project: Path
) -> None:
    text = '#include "local.cuh"\n__global__ void k(float* x) { x[0] = twice(1.f); }\n'
    text += "int main() { k<<<1, 1>>>(nullptr); return 0; }\n"
    assert cpu_pool.validate_cu(text, filename="c.cu", folder=project).status == "compiled"
    cpu_pool._verdicts.clear()  # the pool's memory forgets: the worker's on-disk cache answers
    again = cpu_pool.validate_cu(text, filename="c.cu", folder=project)
    assert again.status == "compiled" and "cached" in again.message
    (project.parent / "common.h").write_text("#pragma once\n#define FACTOR undefined_factor\n")
    stale = cpu_pool.validate_cu(text, filename="c.cu", folder=project)
    assert stale.status == "compile_error" and "undefined_factor" in stale.message


def test_build_options_give_include_paths_and_defines(cpu_pool: ValidatorPool, tmp_path: Path) -> None:
    (tmp_path / "third_party").mkdir()
    (tmp_path / "third_party" / "vendor.h").write_text("#pragma once\n#define VENDOR_N N_FROM_DEFINE\n")
    (tmp_path / "src").mkdir()
    text = "#include <vendor.h>\n__global__ void k(int* x) { x[0] = VENDOR_N; }\nint main() { return 0; }\n"
    missing = cpu_pool.validate_cu(text, filename="v.cu", folder=tmp_path / "src")
    assert missing.status == "compile_error" and "vendor.h" in missing.message
    assert "dice.includePaths" in missing.message  # a hint: no compile command, no include path
    options = BuildOptions(
        include_paths=("third_party",), defines=("N_FROM_DEFINE=3",), workspace_root=str(tmp_path)
    )
    v = cpu_pool.validate_cu(text, filename="v.cu", folder=tmp_path / "src", build=options)
    assert v.status == "compiled", v.log


@pytest.fixture()
def nvrtc_only_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValidatorPool]:
    old = {k: os.environ.get(k) for k in ("DICE_NVCC", "DICE_CACHE_DIR")}
    os.environ["DICE_NVCC"] = "none"
    os.environ["DICE_CACHE_DIR"] = str(tmp_path_factory.mktemp("dice-cache-nvrtc"))
    try:
        with ValidatorPool(1, gpu=False, timeout_s=30) as pool:
            yield pool
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_without_nvcc_host_code_and_uninstantiated_templates_are_reported_unchecked(
    nvrtc_only_pool: ValidatorPool,
) -> None:
    v = nvrtc_only_pool.validate_cu(TEMPLATE_ONLY_HOST_USES, filename="t.cu")
    assert v.status == "compiled" and "nvcc not found" in v.message
    by_function = {u["function"]: u for u in v.unchecked}
    assert set(by_function) == {"main"}  # scale<float> is instantiated from the launch (name expression)
    assert "1 template launch(es) instantiated" in v.message
    hidden = TEMPLATE_ONLY_HOST_USES.replace("scale<float><<<1, 32>>>(nullptr, 2.f);", "")
    v = nvrtc_only_pool.validate_cu(
        hidden.replace("x[threadIdx.x] *= s;", "x[0].nothing();"), filename="t.cu"
    )
    assert v.status == "compiled"  # NVRTC never parsed the body: the verdict says so
    assert {u["function"] for u in v.unchecked} == {"scale", "main"}
    from dice.validator.verdict import mark_unchecked, verdict_label

    assert verdict_label(mark_unchecked(v, 3)) == "not checked (template never instantiated) · not run"


def test_nvrtc_prefers_the_toolkit_headers_and_keeps_the_pip_ones_after() -> None:
    dirs = cuda_include_dirs()
    toolkit, pip = toolkit_include_dir(), pip_cuda_include_dir()
    if toolkit:
        assert dirs[0] == toolkit and (Path(toolkit) / "crt").is_dir()
    if toolkit and pip:
        assert dirs[-1] == pip
    from dice.validator.compile import nvrtc_compile

    assert nvrtc_compile("#include <mma.h>\n__global__ void k() {}\n").ok


def test_the_pip_cuda_headers_come_after_the_toolkit(tmp_path: Path) -> None:
    from dice.validator.build_flags import BuildFlags
    from dice.validator.whole_file import _command, extra_system_includes

    pip = pip_cuda_include_dir()
    extra = extra_system_includes(BuildFlags())
    if pip is None or extra == []:
        pytest.skip("no pip CUDA headers, or a toolkit with cuBLAS")
    assert extra == ["-isystem", pip]
    assert extra_system_includes(BuildFlags(includes=(("-isystem", pip),))) == []  # named by the command
    cmd = _command("nvcc", BuildFlags(includes=(("-I", "/proj/inc"),)), "90", str(tmp_path / "k.cu"), None)
    assert cmd.index(f"-Xcompiler=-iquote,{tmp_path}") < cmd.index("-I/proj/inc") < cmd.index(pip)
    # nvcc puts its own toolkit folder first as -I: the 13.0 runtime headers win over the pip 13.5 ones


def test_cublas_headers_are_found_without_a_command(cpu_pool: ValidatorPool, tmp_path: Path) -> None:
    text = "#include <cublas_v2.h>\n"
    text += "int main() { cublasHandle_t h; return cublasCreate(&h) == CUBLAS_STATUS_SUCCESS; }\n"
    v = cpu_pool.validate_cu(text, filename="blas.cu", folder=tmp_path)
    assert v.status == "compiled", v.log


def test_an_edited_compile_commands_json_is_never_answered_from_a_stale_verdict(
    cpu_pool: ValidatorPool, tmp_path: Path
) -> None:
    import json

    src = tmp_path / "k.cu"
    text = "#if VAL != 1\n#error VAL is not 1\n#endif\n__global__ void k() {}\nint main() { return 0; }\n"
    src.write_text(text)

    def database(val: int) -> None:
        entry = {"directory": str(tmp_path), "file": "k.cu", "command": f"nvcc -DVAL={val} -c k.cu -o k.o"}
        (tmp_path / "compile_commands.json").write_text(json.dumps([entry]))

    database(1)
    first = cpu_pool.validate_cu(text, filename="k.cu", folder=tmp_path)
    assert first.status == "compiled" and "compile_commands.json entry" in first.message, first.log
    database(2)
    os.utime(tmp_path / "compile_commands.json", ns=(2, 2))
    second = cpu_pool.validate_cu(text, filename="k.cu", folder=tmp_path)
    assert second.status == "compile_error" and second.diagnostics[0]["line"] == 1
    assert second.diagnostics[0]["source"] == "host compiler"  # the preprocessor's #error


def test_code_in_a_false_preprocessor_branch_is_reported_unchecked(
    cpu_pool: ValidatorPool, tmp_path: Path
) -> None:
    from dice.validator.verdict import mark_unchecked, verdict_label

    text = (
        "__global__ void k(int* x) {\n"
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 300\n"
        "    int dice_garbage = ;\n"
        "#endif\n"
        "    x[0] = 1;\n"
        "}\n"
        "int main() { k<<<1, 1>>>(nullptr); return 0; }\n"
    )
    v = cpu_pool.validate_cu(text, filename="old.cu", folder=tmp_path)
    assert v.status == "compiled", v.log
    assert [(u["line"], u["end_line"], u["function"]) for u in v.unchecked] == [(2, 2, "k")]
    assert verdict_label(mark_unchecked(v, 2)) == "not checked (preprocessor branch not compiled) · not run"
    assert mark_unchecked(v, 4) is v
