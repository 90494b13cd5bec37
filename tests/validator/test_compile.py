from __future__ import annotations

import pytest

from dice.cuda_source import extract_device_code
from dice.validator.compile import map_compiler_log, nvrtc_compile
from dice.validator.paths import cuda_include_dirs, nvcc_path

MIXED = """#include <cstdio>
#include <cuda_fp16.h>

// host helper first: it is not part of the device code
static void check(cudaError_t e) { if (e != cudaSuccess) printf("%s\\n", cudaGetErrorString(e)); }

__global__ void scale(const __half* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]) * undefined_factor;
}

int main() {
    scale<<<1, 32>>>(nullptr, nullptr, 0);
    check(cudaDeviceSynchronize());
    return 0;
}
"""


def test_cuda_headers_are_found_for_nvrtc() -> None:
    assert any((__import__("pathlib").Path(d) / "cuda_fp16.h").is_file() for d in cuda_include_dirs())


def test_nvrtc_compiles_device_code_without_a_gpu() -> None:
    result = nvrtc_compile(
        "#include <cuda_fp16.h>\n__global__ void k(__half* x) { x[0] = __float2half(1.f); }\n"
    )
    assert result.ok, result.log
    assert result.arch.startswith("sm_")


def test_nvrtc_errors_map_to_the_files_own_lines() -> None:
    device = extract_device_code(MIXED)
    assert device.has_host_code
    result = nvrtc_compile(device.source, line_map=device.line_map, display_name="mixed.cu")
    assert not result.ok
    # line 9 (1-based) of MIXED holds `undefined_factor`, whatever the extraction removed above it
    assert [d["line"] for d in result.diagnostics] == [8]
    assert "undefined_factor" in result.diagnostics[0]["message"]
    assert "mixed.cu(9): error" in result.log


def test_torch_headers_get_empty_stand_ins_only_when_asked() -> None:
    src = "#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = 1.f; }\n"
    assert not nvrtc_compile(src).ok
    result = nvrtc_compile(src, stub_header_prefixes=("torch/",))
    assert result.ok and "torch/extension.h" in result.log


def test_map_compiler_log_rewrites_lines_and_keeps_header_references() -> None:
    log = (
        'dice_device.cu(2): error: identifier "y" is undefined\n'
        "/usr/include/foo.h(10): warning #177-D: unused\n"
        "dice_device.cu(40): error: out of the map\n"
    )
    mapped, diags = map_compiler_log(log, [10, 20, 30], "a.cu")
    assert "a.cu(21): error" in mapped
    assert "/usr/include/foo.h(10): warning #177-D" in mapped
    assert "dice_device.cu(40)" in mapped
    assert diags == [
        {
            "line": 20,
            "severity": "error",
            "message": 'identifier "y" is undefined',
            "column": None,
            "source": "nvrtc",
            "notes": [],
        }
    ]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_nvcc_checks_host_code(tmp_path) -> None:
    from dice.validator.compile import nvcc_compile_check

    bad = MIXED.replace("undefined_factor", "2.f").replace("return 0;", "return undefined_host;")
    result = nvcc_compile_check(bad, workdir=tmp_path, display_name="host.cu")
    assert result is not None and not result.ok
    assert [d["line"] for d in result.diagnostics] == [14]
    assert "host.cu(15)" in result.log
