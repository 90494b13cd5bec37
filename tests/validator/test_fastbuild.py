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

from dice.validator import fastbuild
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
    slim = fastbuild.slim_cuda_text(text)
    assert slim == "#include <torch/types.h>\n#include <cuda.h>\n\n__global__ void k() {}\n"
    assert fastbuild.slim_cuda_text(text + "namespace py = pybind11;\n") is None
    assert fastbuild.slim_cuda_text(text + "auto m = torch::nn::Linear(2, 2);\n") is None
    assert (
        fastbuild.slim_cuda_text(text.replace("#include <torch/types.h>\n", "")) is None
    )  # no_implicit_headers
    assert (
        fastbuild.slim_cuda_text("#include <torch/types.h>\n__global__ void k() {}\n") is None
    )  # nothing to do


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
    assert fastbuild.needs_full_headers(output) is retry


# ---------------------------------------------------------------------------------------------- direct build
def test_direct_build_compiles_slim_cu_and_pch_main_then_links(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "__global__ void k() {}\n")
    info: dict = {}
    assert fastbuild.direct_build(folder, "Error building extension 'ext_1'", cache, info)
    assert (folder / "ext_1.so").is_file() and not list(folder.glob("*.tmp*"))
    assert info["cuda_compile_mode"] == "slim" and info["compile_mode"] == "pch" and info["pch"] == "built"
    slim = (folder / "cuda.slim.cu").read_text().splitlines()
    assert slim[0] == f'#line 1 "{folder}/cuda.cu"' and slim[4] == ""  # the umbrella include blanked
    main = (folder / "main.pch.cpp").read_text().splitlines()
    header = Path(main[0].split('"')[1])
    assert header.name == "dice_torch.h" and header.with_suffix(".h.gch").is_file()
    assert header.read_text() == "#include <torch/extension.h>\n"
    assert main[1] == f'#line 2 "{folder}/main.cpp"' and main[2] == "torch::Tensor f(torch::Tensor x);"
    compiled = sorted(Path(p).name for p in log.read_text().split())
    assert compiled == ["cuda.slim.cu", "dice_torch.h", "main.pch.cpp"]
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


def test_extra_binding_tus_compile_with_their_own_flags_and_link_in(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "")
    (folder / "main_1.cpp").write_text("#include <torch/extension.h>\nint g();\n")
    info: dict = {}
    extra = [("main_1.o", str(folder / "main_1.cpp"), "-DTORCH_EXTENSION_NAME=ext_1 -O3")]
    assert fastbuild.direct_build(folder, "x", cache, info, extra)
    assert info["compile_mode"] == info["compile_1_mode"] == "pch" and (folder / "main_1.pch.cpp").is_file()
    assert len(list((cache / "pch").iterdir())) == 2  # -O3 needs a PCH of its own
    assert (folder / "main_1.o").is_file() and (folder / "ext_1.so").is_file()


def test_slim_failure_on_a_torch_name_retries_the_full_cu(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "// NEEDS_FULL\n")
    info: dict = {}
    assert fastbuild.direct_build(folder, "x", cache, info)
    assert info["cuda_compile_mode"] == "slim failed, full"
    assert [Path(p).name for p in log.read_text().split() if p.endswith(".cu")] == ["cuda.slim.cu", "cuda.cu"]


def test_compile_error_is_raised_with_compiler_output_first_and_recorded(fake_build) -> None:
    folder, cache, log = fake_build
    write_cu(folder, "// TYPO\n")
    with pytest.raises(RuntimeError) as err:
        fastbuild.direct_build(folder, "Error building extension 'ext_1'", cache, {})
    message = str(err.value)
    assert message.startswith("Error building extension 'ext_1': ") and '"blockIdxx" is undefined' in message
    assert "FAILED: cuda.cuda.o" in message
    assert len([p for p in log.read_text().split() if p.endswith(".cu")]) == 1  # not a torch name: no retry
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
    assert steps["compile_mode"] == "pch" and steps.get("pch") in ("built", "used", "used (waited)"), steps
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
