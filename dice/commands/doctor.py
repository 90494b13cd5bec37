"""``dice doctor``: what the validator can use here -- the worker sandbox, nvcc, NVRTC, the GPUs."""

from __future__ import annotations

import argparse
import glob
import subprocess


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the validator's sandbox, compilers and GPU",
        description=(
            "Print the isolation validator workers get here (bwrap, the Landlock fallback, or none; "
            "DICE_SANDBOX=auto|required|off chooses), the nvcc and NVRTC found, and whether a GPU is "
            "visible. "
            "Exits 1 when DICE_SANDBOX=required cannot be met (no pool would start), else 0."
        ),
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dice.validator import sandbox

    code = 0
    best = sandbox.available()
    print(f"isolation: {sandbox.describe(best)}")
    print(f"  bwrap: {sandbox.bwrap_status()[0] or '-'} ({sandbox.bwrap_status()[1]})")
    print(
        f"  landlock: ABI {sandbox.landlock_abi()}"
        + (" (not available)" if sandbox.landlock_abi() < 1 else "")
    )
    seccomp = "libseccomp found: " + sandbox.SECCOMP_WORDS.removeprefix("seccomp: ")
    print(f"  seccomp: {seccomp if sandbox.seccomp_available() else '- (libseccomp is not installed)'}")
    runners = (
        "read-only to runners (Landlock)" if sandbox.landlock_abi() > 0 else "NOT protected from runners"
    )
    print(f"  build cache: written by builders, {runners}; a .so loads only with its builder's SHA-256")
    try:
        mode = sandbox.requested()
        chosen = sandbox.choose(mode)
        print(f"  {sandbox.ENV_VAR}={mode}: workers run with {chosen}")
    except (sandbox.SandboxUnavailable, ValueError) as exc:
        print(f"  error: {exc}")
        code = 1
    print(f"nvcc: {_nvcc()}")
    print(f"nvrtc: {_nvrtc()}")
    print(f"gpu: {_gpu()}")
    return code


def _nvcc() -> str:
    from dice.validator.paths import nvcc_path

    path = nvcc_path()
    if path is None:
        return "not found (set DICE_NVCC or CUDA_HOME): whole-file checks are skipped"
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} (does not run: {exc})"
    release = [line for line in done.stdout.splitlines() if "release" in line]
    return f"{path} ({release[-1].strip() if release else 'version unknown'})"


def _nvrtc() -> str:
    from dice.validator.compile import nvrtc_compile

    try:
        result = nvrtc_compile("__global__ void dice_doctor(int* x) { *x = 1; }\n", timeout_s=60)
    except Exception as exc:  # noqa: BLE001 - a missing CuPy or libnvrtc is what this reports
        return f"not usable: {type(exc).__name__}: {exc}"
    return "ok (compiles device code)" if result.ok else f"not usable: {result.log.strip()[:300]}"


def _gpu() -> str:
    from dice.validator.pool import _gpu_count, gpu_available

    nodes = sorted(glob.glob("/dev/nvidia*"))
    seen = f"device nodes: {', '.join(nodes) if nodes else 'none'}"
    if not gpu_available():
        return f"none visible (compile-only validation; {seen})"
    return f"{_gpu_count()} visible ({seen})"
