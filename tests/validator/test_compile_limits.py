"""Compile checks under editor-sized limits: a macro bomb costs its deadline (a few seconds), not the
worker or the caller; compilers are capped in memory and killed with every process they started; a
candidate's ``#include`` of a file outside the project never quotes that file into the verdict."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dice.validator import ValidatorPool
from dice.validator.compile import nvrtc_compile
from dice.validator.diagnostics import outside_source_checker, redact_outside_sources
from dice.validator.lifeline import start_time
from dice.validator.limits import NVRTC, run_command
from dice.validator.paths import nvcc_path

# Each macro level quadruples the one below: D(x) is 2^64 copies of x. NVRTC and gcc's preprocessor expand
# it until they run out of time or memory (before the limits: 100 % CPU, growing memory, 900 s deadline).
BOMB_MACROS = """#define A(x) x x
#define B(x) A(A(A(A(x))))
#define C(x) B(B(B(B(x))))
#define D(x) C(C(C(C(x))))
"""
DEVICE_BOMB = BOMB_MACROS + "__global__ void k(float* p) { D(p[0] += 1.0f;) }\n"
HOST_BOMB = (
    BOMB_MACROS
    + "__global__ void k(float* p) { p[0] = 1.0f; }\n"
    + "int main() { int x = 0; D(x += 1;) return x; }\n"
)
SECRET = "API_KEY=sk-live-51Habcdef0123456789\npassword = 'hunter2-correct-horse'\n"
SECRET_WORDS = ("sk-live", "51Habcdef0123456789", "API_KEY", "hunter2", "correct-horse", "password")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")


def probe_pid(pool: ValidatorPool) -> int:
    verdict = pool._submit({"kind": "probe", "action": "ok"}, use_cache=False).result(timeout=120)
    return json.loads(verdict.message)["pid"]


@pytest.fixture()
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_a_macro_bomb_times_out_in_seconds_and_the_worker_survives(fresh_cache: Path) -> None:
    with ValidatorPool(1, gpu=False, nvrtc_timeout_s=3.0) as pool:
        pid = probe_pid(pool)
        start = time.perf_counter()
        verdict = pool.validate_cu(DEVICE_BOMB)
        elapsed = time.perf_counter() - start
        assert verdict.status == "timeout" and not verdict.compiled
        assert (
            "NVRTC did not finish within 3 s" in verdict.message and "expands without end" in verdict.message
        )
        assert elapsed < 15
        assert probe_pid(pool) == pid  # the compile was killed, not the worker
        assert pool.validate_cu("__global__ void ok(float* p) { p[0] = 1.0f; }\n").status == "compiled"


def test_the_default_deadlines_are_sized_for_the_editor() -> None:
    defaults = {name: p.default for name, p in inspect.signature(ValidatorPool.__init__).parameters.items()}
    assert defaults["nvrtc_timeout_s"] <= 10  # a fill's NVRTC check: 0.04 s median, 1.4 s p90
    assert defaults["nvcc_timeout_s"] <= 30  # nvcc: 2.4 s median, 6.5 s p90, 12.6 s at most
    assert 60 <= defaults["build_timeout_s"] <= 300  # a cold load_inline build: minutes, not 15
    assert inspect.signature(nvrtc_compile).parameters["timeout_s"].default <= 10


def test_nvrtc_is_stopped_at_its_deadline_and_its_process_replaced() -> None:
    start = time.perf_counter()
    result = nvrtc_compile(DEVICE_BOMB, timeout_s=2.0)
    assert result.timed_out and not result.ok and "within 2 s" in result.log
    assert time.perf_counter() - start < 8
    assert NVRTC.pid is None  # the child compiling the bomb was killed
    again = nvrtc_compile("__global__ void k(float* p) { p[0] = 1.0f; }\n")
    assert again.ok and NVRTC.pid is not None and NVRTC.pid != os.getpid()


def test_nvrtc_reuses_a_private_precompiled_header_without_changing_a_verdict() -> None:
    """The child compiles with NVRTC's automatic PCH in a folder of its own, removed with it; a file whose
    preprocessing differs from the PCH's (a macro before the includes) gets the same diagnostics as without
    one, and no note about the PCH reaches the log."""
    from cupy_backends.cuda.libs import nvrtc

    from dice.validator.nvrtc_child import PCH_SINCE
    from dice.validator.paths import cuda_include_dirs

    if tuple(nvrtc.getVersion()) < PCH_SINCE:
        pytest.skip(f"NVRTC {nvrtc.getVersion()} has no automatic PCH")
    body = (
        "#include <cuda_fp16.h>\n__global__ void k(float* x) {{ x[0] = __half2float(__float2half({})); }}\n"
    )
    sources = [body.format("1.f"), body.format("y"), "#define FOO 1\n" + body.format("y"), body.format("2.f")]
    NVRTC.close()
    with_pch = [nvrtc_compile(src) for src in sources]
    folder = NVRTC._pch_dir
    assert folder is not None and any(Path(folder).glob("*.pch"))
    NVRTC.close()
    assert not Path(folder).exists()
    plain = []
    for src in sources:
        prog = nvrtc.createProgram(src, "dice_device.cu", [], [])
        try:
            try:
                includes = [f"-I{d}" for d in cuda_include_dirs()]
                nvrtc.compileProgram(prog, ["--gpu-architecture=sm_90", "-std=c++17", *includes])
                plain.append(True)
            except nvrtc.NVRTCError:
                plain.append(False)
        finally:
            nvrtc.destroyProgram(prog)
    assert [r.ok for r in with_pch] == plain == [True, False, False, True]
    for r in with_pch:
        assert "precompiled header" not in r.log and "pch" not in r.log.lower()
    assert with_pch[1].log.replace("(2)", "(N)") == with_pch[2].log.replace("(3)", "(N)")


def test_nvrtc_memory_is_capped() -> None:
    start = time.perf_counter()
    result = nvrtc_compile(DEVICE_BOMB, timeout_s=120.0, memory_bytes=512 << 20)
    assert not result.ok and not result.timed_out
    assert "out of memory" in result.log and "512 MiB of address space" in result.log
    assert time.perf_counter() - start < 60  # the cap ends it, long before the deadline
    assert nvrtc_compile("__global__ void k(float* p) { p[0] = 1.0f; }\n", memory_bytes=512 << 20).ok


@needs_nvcc
def test_a_host_code_bomb_stops_nvcc_and_every_compiler_it_started(fresh_cache: Path) -> None:
    name = f"bomb_{uuid.uuid4().hex[:12]}.cu"
    with ValidatorPool(1, gpu=False, nvcc_timeout_s=4.0) as pool:
        start = time.perf_counter()
        verdict = pool.validate_cu(HOST_BOMB, filename=name)
        assert time.perf_counter() - start < 30
        assert "nvcc took longer than 4 s and was stopped" in verdict.message
        assert verdict.status == "compiled" and "host code (main)" in verdict.message  # NVRTC's part only
        time.sleep(0.5)
        assert not _running_with(name), "a compiler of the stopped nvcc is still running"
        assert pool.validate_cu("__global__ void ok(float* p) { p[0] = 1.0f; }\n").status == "compiled"


def _running_with(text: str) -> list[int]:
    """Processes (not zombies) whose command line holds ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline and start_time(int(entry)) is not None:
            found.append(int(entry))
    return found


def test_run_command_kills_its_whole_process_group_at_the_deadline(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {pid_file}; sleep 60"
    result = run_command(["/bin/sh", "-c", script], cwd=tmp_path, env=os.environ, timeout_s=1.0)
    assert result.returncode is None and result.seconds < 5
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while start_time(grandchild) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert start_time(grandchild) is None  # dead (at most a zombie nobody reaped)


def test_run_command_caps_the_address_space(tmp_path: Path) -> None:
    grab = [sys.executable, "-c", "b = bytearray(1 << 30); print('allocated')"]
    capped = run_command(grab, cwd=tmp_path, env=os.environ, timeout_s=30, memory_bytes=256 << 20)
    assert capped.returncode not in (None, 0) and "MemoryError" in capped.stderr
    free = run_command(grab, cwd=tmp_path, env=os.environ, timeout_s=30, memory_bytes=4 << 30)
    assert free.returncode == 0 and "allocated" in free.stdout


@pytest.fixture()
def project(tmp_path: Path) -> tuple[Path, Path]:
    """A project folder, and a secret file outside it."""
    folder = tmp_path / "project"
    folder.mkdir()
    secret = tmp_path / "private" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    return folder, secret


def assert_no_secret(verdict) -> None:
    text = json.dumps(verdict.to_json())
    leaked = [w for w in SECRET_WORDS if w in text]
    assert not leaked, f"{leaked} quoted in the verdict"


@pytest.mark.parametrize("host_code", [False, True], ids=["nvrtc", "nvcc"])
def test_an_include_of_a_file_outside_the_project_is_not_quoted(
    fresh_cache: Path, project: tuple[Path, Path], host_code: bool
) -> None:
    if host_code and nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    folder, secret = project
    (folder / "local.h").write_text("__device__ float scale() { return missing_symbol_in_header; }\n")
    text = f'#include "local.h"\n#include "{secret}"\n__global__ void k(float* p) {{ p[0] = scale(); }}\n'
    if host_code:
        text += "int main() { return 0; }\n"
    with ValidatorPool(1, gpu=False) as pool:
        verdict = pool.validate_cu(text, filename="k.cu", folder=folder)
    assert verdict.status == "compile_error"
    assert_no_secret(verdict)
    # the diagnostics keep their message and place: the error is in secret.txt, reached from line 2
    assert f"{secret}(1): error: this declaration has no storage class or type specifier" in verdict.log
    assert f"source line not shown: {secret} is outside the project" in verdict.log
    first = next(d for d in verdict.diagnostics if d.get("header", {}).get("path") == str(secret))
    assert first["line"] == 1 and first["header"]["line"] == 0
    assert 'identifier "…" is undefined' in verdict.log
    # a header of the project is quoted as the compiler showed it
    assert "return missing_symbol_in_header;" in verdict.log
    assert 'identifier "missing_symbol_in_header" is undefined' in verdict.log


def test_nvrtc_alone_redacts_files_outside_its_include_path(project: tuple[Path, Path]) -> None:
    folder, secret = project
    result = nvrtc_compile(f'#include "{secret}"\n__global__ void k() {{}}\n', options=[f"-I{folder}"])
    assert not result.ok and str(secret) in result.log
    assert not [w for w in SECRET_WORDS if w in result.log + json.dumps(result.diagnostics)]
    inside = nvrtc_compile(f'#include "{secret}"\n__global__ void k() {{}}\n', options=[f"-I{secret.parent}"])
    assert "sk-live-51Habcdef0123456789" in inside.log  # on the include path: quoted as before


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("gutter", [True, False], ids=["line-numbers", "no-line-numbers"])
def test_host_compiler_output_about_an_outside_file_is_redacted(
    project: tuple[Path, Path], gutter: bool
) -> None:
    """gcc's dialect (nvcc's host pass prints it): source lines, carets, and quoted names."""
    folder, secret = project
    secret.write_text("int f() { return undefined_thing_hunter2; }\n")
    (folder / "main.cpp").write_text(f'#include "{secret}"\nint main() {{ return missing_here; }}\n')
    flags = [] if gutter else ["-fno-diagnostics-show-line-numbers"]
    cmd = ["g++", "-fsyntax-only", *flags, "main.cpp"]
    log = subprocess.run(
        cmd, cwd=folder, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
    ).stderr
    assert "undefined_thing_hunter2; }" in log  # gcc quoted the outside file
    redacted = redact_outside_sources(log, outside_source_checker([str(folder)], cwd=str(folder)))
    assert "hunter2" not in redacted and "int f()" not in redacted
    assert f"{secret}:1:18: error: '…' was not declared in this scope" in redacted
    assert "main.cpp:2:" in redacted and "missing_here" in redacted  # the project's own error is intact
