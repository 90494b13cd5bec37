"""The fast load_inline build (dice.validator.fastbuild): torch's build.ninja read and run by direct compiler
calls (with fake compilers: fast), the slim .cu and its retry, the PCH, recorded failures, the build-folder
lock; and one real C++-only build through the interception KernelBench uses (slow: the PCH + one build)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dice.validator import buildtext, fastbuild
from dice.validator.builds import cached_extension_builds

FAKE_CC = r"""#!/bin/sh
out=""; src=""; prev=""
for a in "$@"; do
  if [ "$a" = "--version" ]; then echo "fake-cc (GCC) 12.0 Free Software Foundation"; exit 0; fi
  if [ "$prev" = "-o" ]; then out="$a"; fi
  if [ "$prev" = "-c" ]; then src="$a"; fi
  case "$a" in *.h) src="$a";; esac
  prev="$a"
done
echo "$src" >> "$FAKE_LOG"
if [ -n "$src" ] && grep -q TYPO "$src"; then
  echo "$src(2): error: identifier \"blockIdxx\" is undefined"; exit 1
fi
case "$src" in
  *.lean.cu) if grep -q "NEEDS_FULL\|NEEDS_SLIM" "$src"; then
    echo "$src(3): error: identifier \"softplus\" is undefined"; exit 1
  fi;;
  *.lean-pch.cpp) if grep -q NEEDS_UMBRELLA "$src"; then
    echo "$src:3:5: error: \u2018nn\u2019 is not a member of \u2018torch\u2019"; exit 1
  fi;;
  *.slim.cu) if grep -q NEEDS_FULL "$src"; then
    echo "$src(3): error: namespace \"torch\" has no member \"nn\""; exit 1
  fi;;
esac
touch "$out"
"""


def ninja_text(folder: Path, cc: Path, *, cuda: bool = True) -> str:
    """A build.ninja as torch 2.13 writes it (the compilers replaced by the fake one)."""
    variables = [
        ("ninja_required_version", "1.3"),
        ("cxx", f"/bin/sh {cc}"),
        ("nvcc", f"/bin/sh {cc}"),
        ("cflags", "-DTORCH_EXTENSION_NAME=ext_1 -DTORCH_API_INCLUDE_EXTENSION_H -isystem /t/include -fPIC"),
        ("post_cflags", ""),
        ("cuda_cflags", "-DTORCH_EXTENSION_NAME=ext_1 --expt-relaxed-constexpr --compiler-options '-fPIC'"),
        ("cuda_post_cflags", ""),
        ("cuda_dlink_post_cflags", ""),
        ("sycl_dlink_post_cflags", ""),
        ("ldflags", "-shared -L/t/lib -lc10 -ltorch"),
    ]
    lines = [f"{k} = {v}" for k, v in variables]  # torch leaves a blank after "=" of an empty variable
    lines += [
        "",
        "rule compile",
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
        "  depfile = $out.d",
        "  deps = gcc",
        "",
        "rule cuda_compile",
        "  depfile = $out.d",
        "  deps = gcc",
        "  command = $nvcc -MD -MF $out.d $cuda_cflags -c $in -o $out $cuda_post_cflags",
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "",
        f"build main.o: compile {folder}/main.cpp",
        f"build cuda.cuda.o: cuda_compile {folder}/cuda.cu" if cuda else "",
        "",
        "build ext_1.so: link main.o cuda.cuda.o" if cuda else "build ext_1.so: link main.o",
        "",
        "default ext_1.so",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """(build folder holding main.cpp, cuda.cu and build.ninja, cache root, compiler log)."""
    cc = tmp_path / "fake_cc.sh"
    cc.write_text(FAKE_CC)
    log = tmp_path / "cc.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.delenv("DICE_PCH_DIR", raising=False)
    monkeypatch.delenv("DICE_CCACHE", raising=False)
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "main.cpp").write_text("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x);\n")
    (folder / "build.ninja").write_text(ninja_text(folder, cc))
    return folder, tmp_path / "cache", log


def write_cu(folder: Path, body: str) -> None:
    (folder / "cuda.cu").write_text(
        "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
        "#include <torch/extension.h>\n" + body
    )


# ---------------------------------------------------------------------------------------------- ninja file
def test_parse_ninja_reads_torch_build_file(tmp_path: Path) -> None:
    parsed = fastbuild.parse_ninja(ninja_text(tmp_path, Path("/cc")))
    assert parsed is not None
    variables, rules, builds = parsed
    assert variables["post_cflags"] == "" and "-fPIC" in variables["cflags"]
    assert set(rules) == {"compile", "cuda_compile", "link"}
    assert builds[-1] == ("ext_1.so", "link", ["main.o", "cuda.cuda.o"])
    cmd = fastbuild.expand(rules["cuda_compile"]["command"], variables, ins="a.cu", out="a.o")
    assert cmd.startswith("/bin/sh /cc -MD -MF a.o.d -DTORCH_EXTENSION_NAME=ext_1")
    assert cmd.endswith("-c a.cu -o a.o ")


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("/main.cpp", "/my$ main.cpp"),  # a ninja escape
        lambda t: (
            t + "\nrule cuda_devlink\n  command = $nvcc $in -o $out\nbuild dlink.o: cuda_devlink main.o\n"
        ),
        lambda t: t + "\nsubninja other.ninja\n",
    ],
)
def test_parse_ninja_refuses_what_it_does_not_know(tmp_path: Path, change) -> None:
    assert fastbuild.parse_ninja(change(ninja_text(tmp_path, Path("/cc")))) is None


# ---------------------------------------------------------------------------------------------- slim .cu
def test_slim_cuda_text_blanks_umbrella_includes_only_when_types_h_covers_the_text() -> None:
    text = (
        "#include <torch/types.h>\n#include <cuda.h>\n#include <torch/extension.h>\n__global__ void k() {}\n"
    )
    slim = buildtext.slim_cuda_text(text)
    assert slim == "#include <torch/types.h>\n#include <cuda.h>\n\n__global__ void k() {}\n"
    assert buildtext.slim_cuda_text(text + "namespace py = pybind11;\n") is None
    assert buildtext.slim_cuda_text(text + "auto m = torch::nn::Linear(2, 2);\n") is None
    assert (
        buildtext.slim_cuda_text(text.replace("#include <torch/types.h>\n", "")) is None
    )  # no_implicit_headers
    assert (
        buildtext.slim_cuda_text("#include <torch/types.h>\n__global__ void k() {}\n") is None
    )  # nothing to do


def test_lean_cuda_text_includes_the_operators_called_and_torch_names() -> None:
    text = (
        "#include <torch/types.h>\n#include <cuda.h>\n#include <torch/extension.h>\n"
        "torch::Tensor f(torch::Tensor x) {\n  auto y = torch::zeros_like(x);\n"
        "  return at::softplus(y, 1.0) + torch::empty({2}, x.options().dtype(torch::kFloat32));\n}\n"
    )
    lean = buildtext.lean_cuda_text(text, "/b/cuda.cu")
    assert lean is not None
    head, _, body = lean.partition('#line 1 "/b/cuda.cu"\n')
    assert body.splitlines()[:3] == ["", "#include <cuda.h>", ""]  # same line numbers as the text
    includes = [ln for ln in head.splitlines() if ln.startswith("#include")]
    assert includes[0] == "#include <ATen/core/Tensor.h>"
    assert {"#include <ATen/ops/zeros_like.h>", "#include <ATen/ops/softplus.h>"} <= set(includes)
    assert "#include <ATen/ops/empty.h>" in includes and not any("ATen/ATen.h" in i for i in includes)
    assert "using namespace at;" in head and "inline constexpr auto kFloat32 = at::kFloat;" in head
    # unqualified calls count after `using namespace torch;`
    using = buildtext.lean_cuda_text(
        text.replace("torch::zeros_like", "zeros_like") + "using namespace torch;\n"
    )
    assert using is not None and "#include <ATen/ops/zeros_like.h>" in using
    # what the lean prelude cannot stand for: the slim (or full) text only
    assert buildtext.lean_cuda_text(text + "auto m = torch::nn::Linear(2, 2);\n") is None
    assert buildtext.lean_cuda_text(text + "#include <ATen/ATen.h>\n") is None
    assert buildtext.lean_cuda_text(text + "#include <torch/script.h>\n") is None
    assert buildtext.lean_cuda_text(text + "namespace torch { int g(); }\n") is None
    assert buildtext.lean_cuda_text(text.replace("#include <torch/types.h>\n", "")) is None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists(), reason="nvcc is not installed")
def test_lean_text_of_a_real_candidate_compiles_with_nvcc(tmp_path: Path) -> None:
    """The lean prelude against this torch's headers: a kernel using factories, options, dtypes, dispatch and
    TORCH_CHECK passes nvcc's front end (``--cuda``: host and device code type-checked)."""
    import torch.utils.cpp_extension as cpp_extension

    body = textwrap.dedent(
        """\
        #include <torch/extension.h>
        template <typename scalar_t>
        __global__ void k(const scalar_t* x, scalar_t* y, int64_t n) {
          int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
          if (i < n) y[i] = x[i] > scalar_t(0) ? x[i] : scalar_t(0);
        }
        torch::Tensor f(torch::Tensor x) {
          TORCH_CHECK(x.is_cuda(), "x must be CUDA");
          auto y = torch::empty_like(x);
          auto o = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
          auto z = torch::zeros({x.size(0)}, o);
          AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "k", ([&] {
            k<scalar_t><<<(x.numel() + 255) / 256, 256>>>(
                x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel());
          }));
          return y + z.sum();
        }
        """
    )
    lean = buildtext.lean_cuda_text(
        "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + body, "cuda.cu"
    )
    assert lean is not None
    (tmp_path / "cuda.lean.cu").write_text(lean)
    includes = [arg for p in cpp_extension.include_paths() for arg in ("-isystem", p)]
    includes = ["-I", str(buildtext.lean_include_dir(tmp_path)), *includes]
    flags = list(cpp_extension.COMMON_NVCC_FLAGS) + ["-std=c++20", "-gencode=arch=compute_90,code=sm_90"]
    cmd = ["/usr/local/cuda/bin/nvcc", *includes, *flags, "--cuda", "cuda.lean.cu", "-o", "cuda.ii"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warning" not in out.stdout + out.stderr
    # the shadow took the place of every ATen function (without it, the TU holds them all)
    for shadow, expected in ((includes[:2], False), ([], True)):
        pre = [*shadow, *includes[2:], *flags, "-E", "cuda.lean.cu", "-o", "cuda.i"]
        subprocess.run(["/usr/local/cuda/bin/nvcc", *pre], cwd=tmp_path, check=True, timeout=300)
        assert ("ATen/ops/conv2d.h" in (tmp_path / "cuda.i").read_text()) is expected


@pytest.mark.parametrize(
    ("output", "retry"),
    [
        ('cuda.cu(7): error: namespace "torch" has no member "nn"', True),
        ('cuda.cu(7): error: identifier "py" is undefined', True),
        (
            "cuda.cu:7:5: error: \u2018pybind11\u2019 has not been declared; \u2018py\u2019 was not declared",
            True,
        ),
        ('cuda.cu(7): error: identifier "AT_DISPATCH_V2" is undefined', True),
        (
            'cuda.cu(253): error: no suitable conversion function from "const at::DeprecatedTypeProperties" '
            'to "c10::ScalarType" exists',
            True,
        ),
        ('cuda.cu(7): error: identifier "blockIdxx" is undefined', False),
        ('cuda.cu(7): error: identifier "atomicAddx" is undefined', False),
        ('cuda.cu(7): error: expected a ";"', False),
    ],
)
def test_needs_full_headers_only_for_torch_names(output: str, retry: bool) -> None:
    assert buildtext.needs_full_headers(output) is retry


# ---------------------------------------------------------------------------------------------- direct build
def test_direct_build_compiles_lean_cu_and_pch_main_then_links(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "__global__ void k() {}\n")
    info: dict = {}
    assert fastbuild.direct_build(folder, "Error building extension 'ext_1'", cache, info)
    assert (folder / "ext_1.so").is_file() and not list(folder.glob("*.tmp*"))
    assert info["cuda_compile_mode"] == "lean" and info["compile_mode"] == "lean-pch"
    assert info["pch"] == "built"
    lean = (folder / "cuda.lean.cu").read_text().splitlines()
    start = lean.index(f'#line 1 "{folder}/cuda.cu"')
    assert lean[start + 1] == "" and lean[start + 4] == ""  # torch/types.h and the umbrella include blanked
    assert lean[start + 5] == "__global__ void k() {}" and "torch/types.h" not in "\n".join(lean)
    main = (folder / "main.lean-pch.cpp").read_text().splitlines()
    header = Path(main[0].split('"')[1])
    assert header.name == "dice_torch.h" and header.with_suffix(".h.gch").is_file()
    assert header.read_text() == "#include <torch/python.h>\n"  # the bindings need no more than this
    assert main[1] == f'#line 2 "{folder}/main.cpp"' and main[2] == "torch::Tensor f(torch::Tensor x);"
    compiled = sorted(Path(p).name for p in log.read_text().split())
    assert compiled == ["cuda.lean.cu", "dice_torch.h", "main.lean-pch.cpp"]
    json.loads((folder / fastbuild.BUILD_FILE).read_text())
    # a finished folder is not built again
    log.write_text("")
    assert fastbuild.direct_build(folder, "x", cache, {}) and log.read_text() == ""


def test_pch_is_built_once_per_flags_and_reused(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "")
    fastbuild.direct_build(folder, "x", cache, info := {})
    assert info["pch"] == "built"
    (folder / "ext_1.so").unlink()
    fastbuild.direct_build(folder, "x", cache, info := {})
    assert info["pch"] == "used"
    assert len(list((cache / "pch").iterdir())) == 1  # the extension name is not part of the key


def test_main_cpp_falls_back_to_the_umbrella_pch(fake_build, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lean-PCH error of any kind compiles main.cpp from the torch/extension.h PCH (built only then); a
    main.cpp that names what only the umbrella header declares starts there."""
    folder, cache, log = fake_build
    write_cu(folder, "")
    (folder / "main.cpp").write_text("#include <torch/extension.h>\nint f(); // NEEDS_UMBRELLA\n")
    assert fastbuild.direct_build(folder, "x", cache, info := {})
    assert info["compile_mode"] == "lean-pch failed, pch"
    headers = sorted(h.read_text() for h in (cache / "pch").glob("*/dice_torch.h"))
    assert headers == ["#include <torch/extension.h>\n", "#include <torch/python.h>\n"]
    (folder / "ext_1.so").unlink()
    (folder / "main.cpp").write_text("#include <torch/extension.h>\nauto o = torch::optim::SGD;\n")
    assert fastbuild.direct_build(folder, "x", cache, info := {})
    assert info["compile_mode"] == "pch" and info["pch"] == "used"
    # its own umbrella include is blanked for the lean PCH (line numbers kept)
    (folder / "ext_1.so").unlink()
    (folder / "main.cpp").write_text("#include <torch/extension.h>\n#include <torch/extension.h>\nint h();\n")
    assert fastbuild.direct_build(folder, "x", cache, info := {})
    lean = (folder / "main.lean-pch.cpp").read_text().splitlines()
    assert info["compile_mode"] == "lean-pch" and lean[2:] == ["", "int h();"]
    (folder / "ext_1.so").unlink()
    monkeypatch.setenv("DICE_LEAN", "0")
    (folder / "main.cpp").write_text("#include <torch/extension.h>\nint g();\n")
    assert fastbuild.direct_build(folder, "x", cache, info := {})
    assert info["compile_mode"] == "pch"


def test_extra_binding_tus_compile_with_their_own_flags_and_link_in(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "")
    (folder / "main_1.cpp").write_text("#include <torch/extension.h>\nint g();\n")
    info: dict = {}
    extra = [("main_1.o", str(folder / "main_1.cpp"), "-DTORCH_EXTENSION_NAME=ext_1 -O3")]
    assert fastbuild.direct_build(folder, "x", cache, info, extra)
    assert info["compile_mode"] == info["compile_1_mode"] == "lean-pch"
    assert (folder / "main_1.lean-pch.cpp").is_file()
    assert len(list((cache / "pch").iterdir())) == 2  # -O3 needs a PCH of its own
    assert (folder / "main_1.o").is_file() and (folder / "ext_1.so").is_file()


def test_slim_failure_on_a_torch_name_retries_the_full_cu(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "// NEEDS_FULL\n")
    info: dict = {}
    assert fastbuild.direct_build(folder, "x", cache, info)
    assert info["cuda_compile_mode"] == "lean failed, slim failed, full"
    compiled = [Path(p).name for p in log.read_text().split() if p.endswith(".cu")]
    assert compiled == ["cuda.lean.cu", "cuda.slim.cu", "cuda.cu"]


def test_any_lean_failure_retries_the_slim_cu(fake_build, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "// NEEDS_SLIM\n")  # the lean error names no torch entity: slim is tried anyway
    info: dict = {}
    assert fastbuild.direct_build(folder, "x", cache, info)
    assert info["cuda_compile_mode"] == "lean failed, slim"
    # DICE_LEAN=0: the slim text first
    (folder / "ext_1.so").unlink()
    log.write_text("")
    monkeypatch.setenv("DICE_LEAN", "0")
    assert fastbuild.direct_build(folder, "x", cache, info := {})
    assert info["cuda_compile_mode"] == "slim"


def test_compile_error_is_raised_with_compiler_output_first_and_recorded(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "// TYPO\n")
    with pytest.raises(RuntimeError) as err:
        fastbuild.direct_build(folder, "Error building extension 'ext_1'", cache, {})
    message = str(err.value)
    assert message.startswith("Error building extension 'ext_1': ") and '"blockIdxx" is undefined' in message
    assert "FAILED: cuda.cuda.o" in message
    # lean, then slim; the slim error names no torch entity: the full text is not compiled
    assert [Path(p).name for p in log.read_text().split() if p.endswith(".cu")] == [
        "cuda.lean.cu",
        "cuda.slim.cu",
    ]
    assert fastbuild.recorded_failure(folder) == message
    assert not (folder / "ext_1.so").exists()


def test_transient_failures_are_not_recorded(tmp_path: Path) -> None:
    fastbuild._record_failure(tmp_path, "m", "nvcc error : out of memory")
    fastbuild._record_failure(tmp_path, "m", "error: x", code=-9)
    assert fastbuild.recorded_failure(tmp_path) is None


def test_cpp_only_build_and_no_pch_without_torch_include(fake_build) -> None:
    folder, cache, log = fake_build
    (folder / "build.ninja").write_text(ninja_text(folder, Path(log.parent / "fake_cc.sh"), cuda=False))
    (folder / "main.cpp").write_text("#include <vector>\nint f();\n")  # no_implicit_headers=True
    info: dict = {}
    assert fastbuild.direct_build(folder, "x", cache, info)
    assert info["compile_mode"] == "plain" and "pch" not in info


# ---------------------------------------------------------------------------------------------- locks
def test_key_lock_is_reentrant_and_shared_between_processes(tmp_path: Path) -> None:
    folder = tmp_path / "k"
    with fastbuild.key_lock(folder) as got, fastbuild.key_lock(folder) as again:
        assert got and again
        probe = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
            from pathlib import Path
            from dice.validator.fastbuild import key_lock
            with key_lock(Path({str(folder)!r}), blocking=False) as got:
                print("GOT" if got else "BUSY")
            """
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "BUSY", out.stderr
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "GOT", out.stderr


def test_fallback_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fastbuild.fallback_reason({}) is None
    assert fastbuild.fallback_reason({"is_python_module": False}) is not None
    assert fastbuild.fallback_reason({"sycl_sources": ["x"]}) is not None
    monkeypatch.setenv("DICE_FASTBUILD", "0")
    assert fastbuild.fallback_reason({}) == "DICE_FASTBUILD=0"


# ---------------------------------------------------------------------------------------------- real build
@pytest.fixture(scope="session")
def shared_pch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One PCH folder for the session's real builds (test_batchbuild uses the same one)."""
    return tmp_path_factory.getbasetemp() / "dice-pch"


CPP_SOURCE = """
#include <vector>
torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) { return a + b * s; }
std::vector<int64_t> shape_of(torch::Tensor a) { return a.sizes().vec(); }
"""


@pytest.mark.slow
def test_real_cpp_extension_built_fast_behaves_like_torchs(
    tmp_path: Path, shared_pch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A C++-only load_inline through the KernelBench interception: the fast build (PCH'd main.cpp, direct
    compiler calls) gives the module torch's would: the same functions, docstrings, results."""
    import torch

    monkeypatch.setenv("DICE_PCH_DIR", str(shared_pch))
    records: list[dict] = []
    with cached_extension_builds(tmp_path, records):
        from torch.utils.cpp_extension import load_inline

        ext = load_inline(
            "fast_ext", CPP_SOURCE, functions={"scaled_add": "a + b*s", "shape_of": "shape_of"}, verbose=True
        )
    steps = records[0]["build"]
    assert steps["compile_mode"] == "lean-pch" and steps.get("pch") in ("built", "used", "used (waited)"), (
        steps
    )
    assert sorted(k for k in vars(ext) if not k.startswith("__")) == ["scaled_add", "shape_of"]
    assert ext.scaled_add.__doc__.strip().endswith("a + b*s")
    a, b = torch.arange(4.0), torch.ones(4)
    assert torch.equal(ext.scaled_add(a, b, 0.5), a + b * 0.5)
    assert ext.shape_of(torch.zeros(2, 3)) == [2, 3]
    with pytest.raises(RuntimeError):  # torch's error handling wraps the call (wrap_pybind_function)
        ext.scaled_add(torch.zeros(2), torch.zeros(3), 1.0)
    build_dir = Path(ext.__file__).parent
    assert (build_dir / "main.cpp").read_text().startswith("#include <torch/extension.h>\n")
    # the same sources again: the .so is imported at once
    start = time.perf_counter()
    with cached_extension_builds(tmp_path, records):
        from torch.utils.cpp_extension import load_inline

        again = load_inline(
            "fast_ext", CPP_SOURCE, functions={"scaled_add": "a + b*s", "shape_of": "shape_of"}
        )
    assert records[1]["cached"] and time.perf_counter() - start < 5
    assert torch.equal(again.scaled_add(a, b, 2.0), a + 2 * b)
    assert os.path.samefile(again.__file__, ext.__file__)
