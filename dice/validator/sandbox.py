"""The sandbox every validator worker runs in: bubblewrap where it can run, else Landlock and rlimits.

Candidate code (a fill, a ``ModelNew``, a dice-spec) runs in the workers. Without a sandbox it ran with the
owner's uid, namespaces and environment: it could read an API token from the environment, write into the
user's repository or ``~/.bashrc``, talk to a loopback service, kill the CLI or the language server.

Which isolation a pool uses (``DICE_SANDBOX``, or ``ValidatorPool(sandbox=...)``, which wins):

- ``auto`` (default): :func:`available` -- ``bwrap`` when a real probe of the worker's own bwrap flags runs
  here (once per process, cached), else ``fallback`` when the kernel has Landlock, else ``none``.
- ``required``: as ``auto``, but ``none`` is refused: the pool raises :class:`SandboxUnavailable` and no
  worker starts, so no verdict is ever computed unconfined. ``off``: ``none``.
- ``bwrap`` / ``fallback``: that one or :class:`SandboxUnavailable` (tests, ``dice doctor``).

Why bubblewrap: it is the small, maintained, unprivileged sandbox of Flatpak (user namespaces, no setuid
needed on current distributions), a single binary with no daemon, and it keeps inherited file descriptors
(the worker's result pipe). Its flags here (:func:`bwrap_command`):

- ``--die-with-parent``: the sandbox gets SIGKILL when the pool's process goes (with the worker's own
  ``PR_SET_PDEATHSIG`` and result-pipe watchdog, :mod:`dice.validator.lifeline`).
- ``--unshare-net``: a network namespace with only a loopback of its own: no connection leaves it, not even
  to the host's loopback listeners.
- ``--unshare-pid``: a pid namespace: the owner, the editor and every other process of the user are not
  visible, so they cannot be signalled or read through ``/proc``; when the sandbox's init dies, the kernel
  kills everything inside. ``--new-session``: a session of its own (no ``TIOCSTI`` into the terminal).
- ``--ro-bind / /``: the whole system, the Python environment and the user's files, read-only.
- ``--dev /dev`` (a minimal ``/dev``), ``--dev-bind`` of each existing ``/dev/nvidia*`` node (CUDA),
  ``--tmpfs /dev/shm`` (a private one), ``--proc /proc`` (the namespace's own). On a machine with GPU
  nodes the probe also starts CUDA (``cuInit``) inside: where that fails, the workers use the fallback
  (and the ``isolation:`` line says so) rather than bwrap workers that cannot reach the GPU.
- ``--bind`` (writable) only the worker's folder (cwd, HOME, and ``TMPDIR=<folder>/tmp``) and the build
  cache folders it writes (:func:`writable_paths`: ``DICE_WORKER_CACHE`` -- torch extensions, CuPy, nvcc,
  GPU locks --, ``DICE_PCH_DIR``, ``CCACHE_DIR`` when set). ``/tmp`` stays read-only rather than a
  ``--tmpfs``: the files a ``.cu`` task reads (its folder, the modules its dice-spec imports) may live
  under ``/tmp`` and are only known per task; the private tmp is the worker's ``TMPDIR``.
- ``--clearenv`` and ``--setenv`` of an allow-list (:func:`worker_env`); ``--chdir`` the worker's folder.

The fallback (no usable bwrap) is applied by the worker to itself at start, before any task
(:func:`confine_self`): the same cleared environment, fresh HOME and cwd (set by the pool), rlimits
(no core files, an 8 GiB file size cap, a process count cap generous for nvcc, gcc and ninja), and
Landlock: writes only beneath the writable folders (and ``/dev`` files such as ``/dev/null`` and the GPU
nodes, ``/dev/shm``); with ABI >= 4 no TCP bind or connect; with ABI >= 6 no signals to, and no abstract
UNIX sockets of, processes outside the sandbox. Landlock also denies ``ptrace`` of (and so
``/proc/PID/environ`` of) processes outside it. Landlock is called through ctypes: the standard library
has no binding, and the ``landlock`` package on PyPI is a pre-release (1.0.0.dev5) we would not depend on.

Seccomp (libseccomp, where installed; :func:`apply_seccomp`), in every confined worker and so in
its zygote, runners and builders: ``socket()`` of no family but UNIX and netlink (no internet socket:
UDP, raw and IPv6 included, which Landlock does not cover) and no io_uring; a runner adds, after its
CUDA start, no new UNIX sockets (pathname sockets, an ssh agent's or a container daemon's, are out of
Landlock's reach).

The build cache is written only by builders (:mod:`dice.validator.builder`); a runner's Landlock layer
leaves it read-only, and a runner loads a cached ``.so`` only when its content hash matches the
builder's manifest. Where Landlock is missing (ABI 0), nothing stops a runner from writing the
cache (a ``.so`` and a manifest that matches it); ``dice doctor`` shows the Landlock ABI.

Not covered yet: reads are not restricted (the user's files, ``~/.ssh`` included, are readable; with no
network, what a candidate reads can only reach the verdict shown to the same user); on kernels before
Landlock ABI 6 a candidate can still signal the owner; the GPU device nodes are bound as they are
(untested on machines without a GPU).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import glob
import json
import os
import platform
import resource
import select
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ENV_VAR = "DICE_SANDBOX"
MODES = ("auto", "required", "off", "bwrap", "fallback")
WORKER_ENV = "DICE_WORKER_SANDBOX"  # what the worker was started in: bwrap | fallback | none
WRITABLE_ENV = "DICE_WORKER_WRITABLE"  # os.pathsep-separated folders the fallback leaves writable

DESCRIPTIONS = {
    "bwrap": "bwrap (no network, read-only system, private TMPDIR, pid namespace, cleared environment)",
    "none": "none",
}

# Variables a worker keeps (exact names, then prefixes); everything else is dropped.
_KEEP = {
    "PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "PYTHONPATH", "PYTHONHASHSEED",
    "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "VIRTUAL_ENV",
    "CONDA_PREFIX", "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "CUPY_CACHE_DIR",
    "MAX_JOBS", "CC", "CXX", "CUDAHOSTCXX", "CCACHE_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "HOME", "TMPDIR",
    # read by the worker and the task modules (context.py, worker.py, limits.py, paths.py, fastbuild.py,
    # whole_file.py, kbeval.py, pool.py)
    "DICE_WORKER_CACHE", "DICE_WORKER_LOG", "DICE_WORKER_GPU", "DICE_WORKER_OWNER", "DICE_GPU_LOCK",
    "DICE_GPU_LOCK_WAIT_S", "DICE_CACHE_DIR", "DICE_NVCC", "DICE_CUDA_ARCH", "DICE_COMPILE_MEMORY_MB",
    "DICE_VALIDATOR_GPU", "DICE_CCACHE", "DICE_FASTBUILD", "DICE_LEAN", "DICE_PCH", "DICE_PCH_DIR",
    "DICE_PREBUILD_JOBS", "DICE_KERNELBENCH_PROBLEMS", "DICE_SHARED_DATA", WORKER_ENV, WRITABLE_ENV,
    "DICE_VALIDATOR_EMULATE", "DICE_EMULATED_EXTENSIONS",  # the CPU tests' emulated GPU path (judge.py)
}  # fmt: skip
_KEEP_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NVCC_")

FILE_SIZE_LIMIT = 8 << 30
PROCESS_HEADROOM = 4096  # processes beyond what the user already runs (RLIMIT_NPROC counts per user)

# <linux/landlock.h>
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_WRITE_FILE = 1 << 1
_FS_WRITES = sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make *
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_PR_SET_NO_NEW_PRIVS = 38


class SandboxUnavailable(RuntimeError):
    """The isolation asked for cannot run here."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, disabled, too old)."""
    if platform.system() != "Linux":
        return 0
    try:
        version = _libc().syscall(
            ctypes.c_long(_SYS_CREATE), None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION
        )
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


# seccomp through libseccomp, the maintained library (it writes the BPF program, the architecture checks
# and the x32 handling), called through ctypes as Landlock is: its Python bindings ship only with
# distributions (python3-seccomp, not installable into a virtual environment) and the PyPI wrapper
# (pyseccomp 0.1.2) was last released in 2021.
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_EQ, _SCMP_CMP_GE = 4, 5
_AF_UNIX, _AF_NETLINK, _AF_LAST = 1, 16, 45  # AF_MAX is 46 in Linux 6.x
SECCOMP_WORDS = "seccomp: no sockets but UNIX and netlink, no io_uring"
_EACCES, _EPERM = 13, 1


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@functools.cache
def _libseccomp() -> ctypes.CDLL | None:
    if platform.system() != "Linux":
        return None
    for name in ("libseccomp.so.2", ctypes.util.find_library("seccomp")):
        if name:
            with contextlib.suppress(OSError):
                lib = ctypes.CDLL(name, use_errno=True)
                lib.seccomp_init.restype = ctypes.c_void_p
                lib.seccomp_init.argtypes = [ctypes.c_uint32]
                lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
                lib.seccomp_rule_add_array.argtypes = [
                    ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)
                ]  # fmt: skip
                lib.seccomp_load.argtypes = [ctypes.c_void_p]
                lib.seccomp_release.argtypes = [ctypes.c_void_p]
                return lib
    return None


def seccomp_available() -> bool:
    return _libseccomp() is not None


def apply_seccomp(*, unix: bool = False) -> str:
    """A seccomp filter on this process and what it starts, for good: ``socket()`` fails (``EACCES``) for
    every address family but netlink and UNIX (the worker talks to its zygote through UNIX sockets).
    ``unix`` (a runner, after its CUDA start, its channel already open): UNIX sockets are denied too
    (pathname sockets, an ssh agent's or a container daemon's, are out of Landlock's reach). So no
    internet, packet, vsock or other socket of any kind (UDP, raw and IPv6 included, which Landlock does
    not cover); ``io_uring_setup`` fails too (io_uring's socket operations bypass seccomp). Families 0-45
    are compared one by one and anything above 45 as a 64-bit value is denied, so high bits set in the
    argument cannot slip past. Returns the ``isolation:`` words; raises ``OSError`` without libseccomp."""
    lib = _libseccomp()
    if lib is None:
        raise OSError("libseccomp is not installed")
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    allowed = {_AF_NETLINK} | (set() if unix else {_AF_UNIX})
    try:
        nr = lib.seccomp_syscall_resolve_name(b"socket")
        rules = [_ArgCmp(0, _SCMP_CMP_EQ, f, 0) for f in range(_AF_LAST + 1) if f not in allowed]
        rules.append(_ArgCmp(0, _SCMP_CMP_GE, _AF_LAST + 1, 0))
        for cmp in rules:
            if lib.seccomp_rule_add_array(ctx, 0x00050000 | _EACCES, nr, 1, ctypes.byref(cmp)) < 0:
                raise OSError(f"seccomp rule for socket family {cmp.datum_a}")
        uring = lib.seccomp_syscall_resolve_name(b"io_uring_setup")
        if uring >= 0 and lib.seccomp_rule_add_array(ctx, 0x00050000 | _EPERM, uring, 0, None) < 0:
            raise OSError("seccomp rule for io_uring_setup")
        _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        result = lib.seccomp_load(ctx)
        if result < 0:
            raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")
    finally:
        lib.seccomp_release(ctx)
    return "seccomp: no sockets but netlink, no io_uring" if unix else SECCOMP_WORDS


def fallback_description(abi: int | None = None) -> str:
    abi = landlock_abi() if abi is None else abi
    parts = [f"Landlock ABI {abi}: writes only to its folders"]
    if abi >= 4:
        parts.append("no TCP")
    if abi >= 6:
        parts.append("no signals outside")
    if seccomp_available():
        parts.append(SECCOMP_WORDS)
    parts += ["rlimits", "cleared environment", "fresh HOME"]
    return f"fallback ({', '.join(parts)})"


def describe(kind: str) -> str:
    """The ``isolation:`` text of a kind (``bwrap`` / ``fallback`` / ``none``)."""
    return fallback_description() if kind == "fallback" else DESCRIPTIONS[kind]


def _bwrap_flags() -> list[str]:
    flags = ["--die-with-parent", "--unshare-net", "--unshare-pid", "--new-session", "--ro-bind", "/", "/"]
    flags += ["--dev", "/dev"]
    for node in sorted(glob.glob("/dev/nvidia*")):
        flags += ["--dev-bind", node, node]
    return [*flags, "--tmpfs", "/dev/shm", "--proc", "/proc"]


@functools.cache
def bwrap_status() -> tuple[str | None, str]:
    """(path of a bwrap that runs the worker's flags here, or None; why not). Probed once per process."""
    path = shutil.which("bwrap")
    if path is None:
        return None, "bwrap not found on PATH"
    true = shutil.which("true") or "/bin/true"
    try:
        done = subprocess.run(
            [path, *_bwrap_flags(), "--clearenv", "--", true], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap probe failed: {exc}"
    if done.returncode != 0:
        return None, f"bwrap cannot run here: {(done.stderr or '').strip()[:300] or done.returncode}"
    if glob.glob("/dev/nvidia*"):  # a GPU machine: CUDA itself must start inside, else no bwrap
        try:
            cuda = subprocess.run(
                [path, *_bwrap_flags(), "--", *CUDA_PROBE], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"CUDA probe inside bwrap failed: {exc}"
        if cuda.returncode != 0:
            why = (cuda.stderr or cuda.stdout or "").strip()[-300:] or f"cuInit gave {cuda.returncode}"
            return None, f"CUDA does not start inside bwrap: {why}"
    return path, "ok"


# cuInit(0) through the driver library, in a fresh interpreter: 0 when CUDA starts (no torch import: fast)
CUDA_PROBE = [
    sys.executable,
    "-c",
    "import ctypes, sys; sys.exit(min(ctypes.CDLL('libcuda.so.1').cuInit(0), 125))",
]


def available() -> str:
    """The strongest isolation that works here: ``bwrap``, ``fallback`` or ``none``."""
    if bwrap_status()[0] is not None:
        return "bwrap"
    return "fallback" if landlock_abi() >= 1 else "none"


def requested(mode: str | None = None) -> str:
    """The mode asked for: ``mode`` when given, else ``$DICE_SANDBOX``, else ``auto``."""
    value = (mode if mode is not None else os.environ.get(ENV_VAR, "")).strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"sandbox must be one of {', '.join(MODES)}, not {value!r} (${ENV_VAR})")
    return value


def choose(mode: str | None = None) -> str:
    """The isolation a pool runs its workers in; raises :class:`SandboxUnavailable` when the mode cannot
    be met (``required`` with neither bwrap nor Landlock, or a forced kind that is missing)."""
    value = requested(mode)
    if value == "off":
        return "none"
    best = available()
    if value == "auto":
        return best
    if value == "required" and best != "none":
        return best
    if value == "bwrap" and best == "bwrap":
        return best
    if value == "fallback" and landlock_abi() >= 1:
        return "fallback"
    raise SandboxUnavailable(
        f"{ENV_VAR}={value}: no worker sandbox can run here ({bwrap_status()[1]}; Landlock ABI "
        f"{landlock_abi()}); install bubblewrap or enable Landlock, or set {ENV_VAR}=auto"
    )


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` reduced to the allow-list (no tokens, no editor or shell state)."""
    return {k: v for k, v in env.items() if k in _KEEP or k.startswith(_KEEP_PREFIXES)}


def writable_paths(workdir: Path, cache: Path, env: Mapping[str, str]) -> list[Path]:
    """The folders a worker may write: its own, the build cache, the PCH and ccache folders when set."""
    paths = [workdir, cache]
    for name in ("DICE_PCH_DIR", "CCACHE_DIR"):
        if env.get(name):
            paths.append(Path(env[name]))
    for path in paths:
        with contextlib.suppress(OSError):
            path.mkdir(parents=True, exist_ok=True)
    return [p.resolve() for p in paths]


def bwrap_command(
    argv: list[str], *, workdir: Path, writable: Iterable[Path], env: Mapping[str, str], info_fd: int
) -> list[str]:
    """``argv`` wrapped in bwrap (see the module docstring for each flag)."""
    path = bwrap_status()[0]
    if path is None:
        raise SandboxUnavailable(bwrap_status()[1])
    command = [path, *_bwrap_flags(), "--info-fd", str(info_fd)]
    for folder in writable:
        command += ["--bind", str(folder), str(folder)]
    command += ["--clearenv"]
    for key, value in sorted(env.items()):
        command += ["--setenv", key, value]
    return [*command, "--chdir", str(workdir), "--", *argv]


def sandboxed_pid(info_fd: int | None, timeout: float = 5.0) -> int | None:
    """The worker's pid as the pool sees it: the child of the sandbox's init, whose pid bwrap wrote as
    JSON to ``info_fd`` (the read end, closed here); None without one."""
    if info_fd is None:
        return None
    data = b""
    try:
        while b"}" not in data and select.select([info_fd], [], [], timeout)[0]:
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(info_fd)
    try:
        init = int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{init}/task").iterdir():
            children = (task / "children").read_text().split()
            if children:
                return int(children[0])
    return None


def enter_task_dir(task_dir: Path, **env: str) -> None:
    """A runner's or builder's own folder: HOME, TMPDIR (``<task_dir>/tmp``) and cwd there, plus ``env``.
    ``tempfile``'s cached folder is reset: the zygote's preloads computed it from the worker's TMPDIR,
    which a Landlock layer of the task's own leaves read-only."""
    import tempfile

    (task_dir / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ.update(HOME=str(task_dir), TMPDIR=str(task_dir / "tmp"), **env)
    tempfile.tempdir = None
    os.chdir(task_dir)


def set_rlimits() -> None:
    """No core files, a file size cap, and a process cap well above what nvcc, gcc and ninja need."""
    user_processes = 0
    with contextlib.suppress(OSError):
        uid = os.getuid()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    user_processes += entry.stat().st_uid == uid
    for limit, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT),
        (resource.RLIMIT_NPROC, user_processes + PROCESS_HEADROOM),
    ):
        with contextlib.suppress(ValueError, OSError):
            _, hard = resource.getrlimit(limit)
            soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (soft, hard))


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"landlock {what}: {os.strerror(errno)}")
    return result


def apply_landlock(writable: Iterable[Path]) -> int:
    """Restrict this process (and what it starts) for good: writes only beneath ``writable`` (and device
    files, ``/dev/shm``, ``/proc`` files), no TCP (ABI >= 4), no signals or abstract sockets outside
    (ABI >= 6). Returns the ABI used; raises ``OSError`` where Landlock is missing."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    libc = _libc()
    writes = _FS_WRITES | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(writes, _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0, 0)
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _check(
        libc.syscall(ctypes.c_long(_SYS_CREATE), ctypes.byref(attr), ctypes.c_size_t(size), 0), "ruleset"
    )
    try:
        device_writes = _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
        # /proc: cuInit writes /proc/<pid>/task/<tid>/comm (thread names) and fails with error 304 without
        # it (seen on the H200). Writing another process's /proc entries still needs ptrace access, which
        # Landlock denies outside the domain; /proc/sys needs root.
        rules = [(Path(p), writes) for p in writable] + [
            (Path("/dev"), device_writes),
            (Path("/dev/shm"), writes),
            (Path("/proc"), device_writes),
        ]
        for path, allowed in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = _PathBeneath(allowed, fd)
                _check(
                    libc.syscall(
                        ctypes.c_long(_SYS_ADD_RULE), ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0
                    ),
                    f"rule {path}",
                )
            finally:
                os.close(fd)
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(libc.syscall(ctypes.c_long(_SYS_RESTRICT), ruleset, 0), "restrict_self")
    finally:
        os.close(ruleset)
    return abi


def confine_self() -> str:
    """In the worker, before any task: rlimits, and Landlock when started as ``fallback``. Returns the
    ``isolation:`` text; raises ``OSError`` when the fallback cannot be applied (the worker then refuses
    to start)."""
    kind = os.environ.get(WORKER_ENV, "none")
    if kind == "none":
        return describe("none")
    set_rlimits()
    words = apply_seccomp() if seccomp_available() else None
    if kind == "fallback":
        writable = [Path(p) for p in os.environ.get(WRITABLE_ENV, "").split(os.pathsep) if p]
        return fallback_description(apply_landlock(writable))
    return describe(kind) + (f" + {words}" if words else "")


def sandboxed(
    env: Mapping[str, str], *, isolation: str, workdir: Path, cache: Path, result_fd: int
) -> tuple[list[str], dict[str, str], list[int], int | None]:
    """How the pool starts a worker (``python -m dice.validator.worker RESULT_FD``) in ``isolation``:
    (command, environment, fds to pass, the read end of bwrap's info pipe for :func:`sandboxed_pid` or
    None). The fds passed are the caller's to close."""
    argv = [sys.executable, "-m", "dice.validator.worker", str(result_fd)]
    if isolation == "none":  # DICE_SANDBOX=off, or nothing available: the environment as it was
        return argv, {**env, WORKER_ENV: "none"}, [result_fd], None
    kept = {**worker_env(env), WORKER_ENV: isolation}
    writable = writable_paths(workdir, cache, kept)
    kept[WRITABLE_ENV] = os.pathsep.join(map(str, writable))
    if isolation != "bwrap":
        return argv, kept, [result_fd], None
    kept["DICE_WORKER_OWNER"] = "1"  # the worker's parent is the sandbox's init, in its own pid namespace
    info_read, info_write = os.pipe()
    command = bwrap_command(argv, workdir=workdir, writable=writable, env=kept, info_fd=info_write)
    return command, kept, [result_fd, info_write], info_read
