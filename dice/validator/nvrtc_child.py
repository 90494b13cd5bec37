"""The NVRTC compile process, run as a file: ``main(RESULT_FD, MEMORY_BYTES, PARENT_PID[, PCH_DIR])``.

:class:`dice.validator.limits.NvrtcProcess` starts it by path (``runpy``, with no folder of this package on
``sys.path``), so that no package ``__init__`` runs: only the standard library and CuPy's NVRTC binding are
imported (half a second). It sends one JSON request per line on stdin: ``{"source", "options", "stubs",
"names", "cpu_s"}``; each answer is one JSON line on RESULT_FD: ``{"ok", "log"}``. ``{"ready": true}``
comes first, once NVRTC is loaded.

It caps its own address space at what it uses once NVRTC is loaded plus MEMORY_BYTES (``RLIMIT_AS``:
NVRTC then reports "out of memory" instead of growing), its CPU time per request (``RLIMIT_CPU``, raised
before each one), disables core dumps, and asks for SIGKILL when its parent exits (``PR_SET_PDEATHSIG``,
through ctypes: the standard library has no ``prctl``). The parent kills it at a request's deadline.

With PCH_DIR (a private folder the parent makes and removes) and NVRTC 12.4 or later, every compile asks for
NVRTC's automatic precompiled header (``--pch``): the CUDA headers every file includes are parsed once per
child, not once per compile where the same headers come again (1.64x on a reward's groups of a heavy-header
task file; 0.8x on files compiled once each: ``benchmarks/results/nvrtc_pch_cpu.md``). NVRTC
checks that a later compile's header prefix and options match before it uses a PCH. Its notes about the
PCH (created, used, or why one could not be used) are turned off and, should one still appear, taken out
of the log: they are not about the user's code.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1
PCH_SINCE = (12, 4)  # NVRTC's first release with --pch
_PCH_NOTE = re.compile(
    r'^"[^"\n]*": (?:creating|using) precompiled header file "[^"\n]*"\n?'
    r"|^Warning #63\d-D: [^\n]*precompiled header[^\n]*\n?",
    re.MULTILINE,
)


def _die_with_parent(parent: int) -> None:
    # not Linux: no prctl; the parent's kill at the deadline remains
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(70)


def _address_space() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _compile(nvrtc, request: dict, pch: list[str]) -> dict:  # noqa: ANN001 - CuPy's module
    stubs = list(request.get("stubs") or [])
    names = list(request.get("names") or [])
    prog = nvrtc.createProgram(
        request["source"], "dice_device.cu", [b""] * len(stubs), [s.encode() for s in stubs]
    )
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, list(request.get("options") or []) + pch)
            ok = True
        except nvrtc.NVRTCError:
            ok = False
        log = nvrtc.getProgramLog(prog) or ""
        return {"ok": ok, "log": _PCH_NOTE.sub("", log) if pch else log}
    finally:
        nvrtc.destroyProgram(prog)


def main(argv: list[str]) -> int:
    fd, memory, parent = int(argv[0]), int(argv[1]), int(argv[2])
    pch_dir = argv[3] if len(argv) > 3 else ""
    _die_with_parent(parent)
    out = os.fdopen(fd, "w", buffering=1)
    from cupy_backends.cuda.libs import nvrtc

    version = tuple(nvrtc.getVersion())  # also loads libnvrtc before the cap is measured
    pch = (
        ["--pch", f"--pch-dir={pch_dir}", "--pch-messages=false", "--pch-verbose=false"]
        if pch_dir and version >= PCH_SINCE
        else []
    )
    cap = _address_space() + memory
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        # CPU time counts over the process's life: the cap is this request's share from now on
        soft = int(_cpu_seconds() + float(request.get("cpu_s", 60))) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        out.write(json.dumps(_compile(nvrtc, request, pch)) + "\n")
    return 0


if __name__ == "__main__":
    # started as ``python -c BOOT <this file> FD MEMORY PARENT``: argv[0] is "-c", argv[1] this file
    sys.exit(main(sys.argv[2:]))
