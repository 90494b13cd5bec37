"""A faster ``load_inline`` build, run inside a worker: the same extension as torch's, built with less work.

torch's ``load_inline`` writes ``main.cpp`` (``#include <torch/extension.h>``, the sources, the pybind11
bindings) and ``cuda.cu`` (``#include <torch/types.h>``, ``<cuda.h>``, ``<cuda_runtime.h>``, the sources),
writes ``build.ninja`` and runs ninja. Measured on a 2-core CPU (gcc 12, nvcc 13 ``--time``, torch 2.13,
``/usr/bin/time``), almost all of a cold build is headers:
``cuda.cu`` of a one-kernel candidate that includes ``<torch/extension.h>`` took 164 s of nvcc (cudafe++
54 s, cicc 62 s, host gcc 41 s, ptxas 0.04 s), 64 s without that include (``torch/types.h``, which
load_inline puts first anyway, is then the only torch header), and ``main.cpp`` 29 s of gcc user time, 10.5
s with a precompiled ``torch/extension.h``. So this module keeps everything torch decides (sources, flags,
names, the import) and changes only how the objects are made:

* the ``.cu`` is compiled from a leaner text first (:mod:`dice.validator.buildtext`: *lean*, then *slim*,
  then the full text, each only when the one before failed; same line numbers, messages name ``cuda.cu``);
* ``main.cpp`` starts from a gcc precompiled header, built once per cache folder (never in torch's install
  folder, where torch's own ``use_pch`` writes and races between processes), under a file lock, keyed by
  compiler, flags, header and torch version (gcc uses a PCH only with the same flags): ``<torch/python.h>``
  (pybind11, torch's casters, ``torch/types.h``, ``torch::nn::Module``; 7.0 s of gcc at ``-O3`` on the 2-core
  CPU, ``<torch/extension.h>``'s 10.0 s) when the text names nothing else of libtorch, else, or after any
  error, ``<torch/extension.h>``;
* ccache runs the compilers when ``DICE_CCACHE=1`` (as in :mod:`dice.validator.whole_file`);
* a compile error is recorded in the build folder: the same sources fail again at once, with the same text.

``DICE_LEAN=0`` skips the lean steps, ``DICE_PCH=0`` the PCH, ``DICE_FASTBUILD=0`` all of this.

Not done, measured: gcc keeps in a PCH the parsed headers but not the code they make each TU emit (an
empty TU after the ``<torch/extension.h>`` PCH takes the same 10 s: pybind11's inline machinery, generated
again per TU); a PCH (600-790 MB for torch 2.13) is valid only for its ``-O`` level (``__OPTIMIZE__``), so
``extra_cflags=["-O3"]`` gets its own. ``main.cpp`` at ``-O0`` for a candidate that asked for ``-O3`` would
save ~40% of it but makes every call of a bound function slower (0.66 instead of 0.11 us on this CPU,
measured on a two-argument function), which the validator's timing would see: the candidate's flags stay.

Why direct compiler calls instead of ninja: the two compiles need different inputs than ``build.ninja``
names (the slim ``.cu``, the PCH include), the PCH is waited for only after the long ``.cu`` compile has
started, the full ``.cu`` is retried on its own, and the result must appear atomically (``.so`` renamed
into place) so that a folder holding a ``.so`` is a finished build for every other worker. The commands
are torch's own: read from the ``build.ninja`` torch wrote, its rule templates expanded; anything this
module does not know there (a device-link step, SYCL, ninja escapes) runs torch's ninja build instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from dice.validator.buildtext import (
    lean_cpp_text,
    lean_cuda_text,
    lean_enabled,
    lean_include_dir,
    needs_full_headers,
    slim_cuda_text,
)
from dice.validator.paths import source_hash
from dice.validator.whole_file import use_ccache

FAILED_FILE = "dice_failed.json"
BATCH_FILE = "dice_batch.json"
BUILD_FILE = "dice_build.json"
MANIFEST_FILE = "dice_manifest.json"  # the builder's: the .so's name and SHA-256 (dice.validator.builder)
PCH_VERSION = "pch-1"
MAX_PCH_SETS = 6  # distinct flag sets with a PCH per cache folder (~0.8 GB each)
_NAME_FLAG = re.compile(r"\s-DTORCH_EXTENSION_NAME=\S+")
RETRY_ANY = frozenset({"lean", "lean-pch"})  # a failed lean step always falls back to the next
_TRANSIENT = re.compile(r"out of memory|Killed|internal compiler error|Segmentation fault|No space left")
_held: dict[tuple[str, int], int] = {}


# ------------------------------------------------------------------------------------------------ locks
@contextlib.contextmanager
def key_lock(folder: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on a build folder, shared by every process on the machine (flock: released when
    the holder dies) and re-entrant inside one process. Yields False when ``blocking`` is off and another
    process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / ".dice-lock")
    mine = (
        path,
        threading.get_ident(),
    )  # another thread's flock (its own open file) waits as a process would
    if _held.get(mine):
        _held[mine] += 1
        try:
            yield True
        finally:
            _held[mine] -= 1
        return
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        _held[mine] = 1
        try:
            yield True
        finally:
            _held.pop(mine, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------ records
def recorded_failure(build_dir: Path) -> str | None:
    """The message of a compile error recorded for this build folder by the same toolchain, else None."""
    try:
        rec = json.loads((build_dir / FAILED_FILE).read_text())
    except (OSError, ValueError):
        return None
    return rec.get("message") if rec.get("toolchain") == toolchain_stamp() else None


def load_from_batch_record(build_dir: Path) -> dict[str, Any] | None:
    """The combined build recorded for this key (:mod:`dice.validator.batchbuild`) when its ``.so`` is
    there with the content hash the builder recorded, else None."""
    try:
        rec = json.loads((build_dir / BATCH_FILE).read_text())
        so = Path(rec["so"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not so.is_file() or rec.get("sha256") != file_sha256(so):
        return None
    return rec


def load_from_batch(build_dir: Path, ext_name: str) -> ModuleType | None:
    """The extension served from a combined build (:mod:`dice.validator.batchbuild`): a module named like
    torch's that holds exactly this call's functions (or, for a call with its own ``PYBIND11_MODULE``,
    everything that bound) from the combined ``.so``; None when there is none."""
    rec = load_from_batch_record(build_dir)
    if rec is None:
        return None
    so = Path(rec["so"])
    try:
        sub = getattr(import_extension(rec["module"], so), rec["sub"])
        names = rec["functions"] or [n for n in vars(sub) if not n.startswith("__")]  # None: its own module
        functions = {name: getattr(sub, name) for name in names}
    except (ImportError, AttributeError, OSError):  # a combined build gone bad: the call builds alone
        return None
    module = ModuleType(ext_name)
    module.__file__ = str(so)
    for name, fn in functions.items():
        setattr(module, name, fn)
    return module


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with contextlib.suppress(OSError), open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(build_dir: Path, so: Path) -> None:
    """Record ``so``'s content hash (the builder does, right after building it); written atomically."""
    tmp = build_dir / f"{MANIFEST_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps({"so": so.name, "sha256": file_sha256(so), "toolchain": toolchain_stamp()}))
    os.replace(tmp, build_dir / MANIFEST_FILE)


def verified_so(build_dir: Path, ext_name: str) -> Path | None:
    """``build_dir/<ext_name>.so`` when the builder's manifest names it and its content hash matches, else
    None (never built, built by an older version without a manifest, or changed since)."""
    so = build_dir / f"{ext_name}.so"
    try:
        rec = json.loads((build_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    if rec.get("so") != so.name or not so.is_file() or rec.get("toolchain") != toolchain_stamp():
        return None
    return so if rec.get("sha256") == file_sha256(so) else None


def import_extension(module_name: str, so: Path, python_module: bool = True) -> Any:
    """Import a built extension as torch does (a fresh module object each time, as torch gives; with
    ``is_python_module=False``, loaded into ``torch.ops`` and its path returned)."""
    import torch.utils.cpp_extension as cpp_extension

    return cpp_extension._import_module_from_library(module_name, str(so.parent), python_module)


def fallback_reason(kwargs: dict[str, Any]) -> str | None:
    """Why this call goes to torch's own ``load_inline`` (None: the fast build handles it)."""
    import torch
    import torch.utils.cpp_extension as cpp_extension

    if os.environ.get("DICE_FASTBUILD", "1").strip() in ("0", "false", "no"):
        return "DICE_FASTBUILD=0"
    if not sys.platform.startswith("linux") or torch.version.hip:
        return "not Linux + CUDA"
    if kwargs.get("sycl_sources") or kwargs.get("with_sycl") or not kwargs.get("is_python_module", True):
        return "SYCL or is_python_module=False"
    for name in ("_run_ninja_build", "_import_module_from_library", "_jit_compile"):
        if not hasattr(cpp_extension, name):
            return f"torch.utils.cpp_extension has no {name}"
    return None


# ------------------------------------------------------------------------------------------------ build
def build(
    original: Callable[..., Any],
    ext_name: str,
    cpp_sources: Any,
    cuda_sources: Any,
    kwargs: dict[str, Any],
    cache_root: Path,
    info: dict[str, Any],
    *,
    fast: bool = True,
) -> None:
    """torch's ``load_inline(ext_name, ...)`` with its ninja step replaced by :func:`direct_build` and its
    import skipped: the builder never loads what it built (a candidate's static initialisers would run in
    the one process that writes the cache). ``fast`` off: torch's own ninja build (the calls
    :func:`fallback_reason` names). The caller holds :func:`key_lock` on ``kwargs["build_directory"]``;
    ``info`` receives the steps' seconds."""
    import torch.utils.cpp_extension as cpp_extension

    ninja = cpp_extension._run_ninja_build

    def run_build(build_directory: str, verbose: bool, error_prefix: str) -> None:
        if not fast or not direct_build(Path(build_directory), error_prefix, cache_root, info):
            ninja(build_directory, verbose, error_prefix)

    with _torch_hooks(run_build, import_module=False):
        original(ext_name, cpp_sources, cuda_sources, **_prepared(kwargs))


def write_build_files(
    original: Callable[..., Any], ext_name: str, cpp_sources: Any, cuda_sources: Any, kwargs: dict[str, Any]
) -> None:
    """torch's ``load_inline`` up to its ``build.ninja`` (sources written, nothing built or imported)."""
    with _torch_hooks(lambda *args, **kwargs: None, import_module=False):
        original(ext_name, cpp_sources, cuda_sources, **_prepared(kwargs))


def _prepared(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments for torch, its build folder made and torch's lock file of a killed worker gone
    (the caller holds :func:`key_lock`)."""
    build_dir = Path(kwargs["build_directory"])
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "lock").unlink(missing_ok=True)
    return dict(kwargs, use_pch=False) if "use_pch" in kwargs else kwargs


@contextlib.contextmanager
def _torch_hooks(run_build: Callable[..., None], *, import_module: bool) -> Iterator[None]:
    """torch's ninja step replaced, its own PCH (in its install folder, racing between processes) neither
    built nor removed, and the import skipped unless ``import_module``."""
    import torch.utils.cpp_extension as cpp_extension

    names = [
        "_run_ninja_build",
        "remove_extension_h_precompiler_headers",
        "_check_and_build_extension_h_precompiler_headers",
        "_import_module_from_library",
    ]
    saved = {name: getattr(cpp_extension, name, None) for name in names}
    cpp_extension._run_ninja_build = run_build
    cpp_extension.remove_extension_h_precompiler_headers = lambda: None
    cpp_extension._check_and_build_extension_h_precompiler_headers = lambda *a, **k: None
    if not import_module:
        cpp_extension._import_module_from_library = lambda *a, **k: None
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(cpp_extension, name, value)


def direct_build(
    build_dir: Path,
    error_prefix: str,
    cache_root: Path,
    info: dict[str, Any],
    extra: list[tuple[str, str, str]] | tuple[()] = (),
) -> bool:
    """Build what ``build_dir/build.ninja`` describes with direct compiler calls; False when the file holds
    something this does not handle (the caller then runs ninja). Raises RuntimeError on a compile error.
    ``extra``: more C++ sources to compile with the compile rule and link in, as (object, source, cflags)."""
    ninja = parse_ninja((build_dir / "build.ninja").read_text())
    if ninja is None:
        info["ninja"] = True
        return False
    variables, rules, builds = ninja
    link = [b for b in builds if b[1] == "link"]
    target = build_dir / link[0][0]
    if target.is_file():
        info["cached"] = True
        return True
    started = time.perf_counter()
    jobs = [
        _job(build_dir, variables, rules[rule], out, ins[0], rule, cache_root, info)
        for out, rule, ins in builds
        if rule != "link"
    ]
    for k, (out, src, cflags) in enumerate(extra, 1):
        job = _job(
            build_dir, dict(variables, cflags=cflags), rules["compile"], out, src, "compile", cache_root, info
        )
        job.rule = f"compile_{k}"
        jobs.append(job)
    jobs.sort(key=lambda j: j.rule != "cuda_compile")  # the long nvcc compile first
    for job in jobs:
        job.start()
    failures = [msg for job in jobs if (msg := job.finish(info)) is not None]
    info["compile_s"] = round(time.perf_counter() - started, 3)
    if failures:
        message = f"{error_prefix}: " + "\n".join(failures)
        _record_failure(build_dir, message, "\n".join(failures))
        raise RuntimeError(message)
    out, _, ins = link[0]
    ins = [*ins, *(obj for obj, _, _ in extra)]
    tmp = f"{out}.tmp{os.getpid()}_{threading.get_ident()}"
    cmd = expand(rules["link"]["command"], variables, ins=" ".join(ins), out=tmp)
    code, output, seconds = _run(cmd, build_dir)
    info["link_s"] = round(seconds, 3)
    if code != 0:
        message = f"{error_prefix}: FAILED: {out}\n{output}\n{cmd}"
        _record_failure(build_dir, message, output, code)
        raise RuntimeError(message)
    os.replace(build_dir / tmp, target)
    with contextlib.suppress(OSError):
        (build_dir / BUILD_FILE).write_text(json.dumps(info, default=str))
    return True


class _Job:
    """One compile: started in the background, finished (and retried with the full ``.cu``) in order."""

    def __init__(
        self, build_dir: Path, rule: str, out: str, commands: list[tuple[str, str]], pch: Any
    ) -> None:
        self.build_dir, self.rule, self.out = build_dir, rule, out
        self.commands: list[tuple[str, Any]] = list(commands)  # (label, command): the first, then fallbacks
        # (a fallback may be a function giving its command, called only when it runs)
        self.pch = pch
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Any = None
        self.started = 0.0

    def start(self) -> None:
        if self.pch is not None:
            self.commands = self.pch()
        self.started = time.perf_counter()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finish(); a pipe could fill and stall
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", self.commands[0][1]],
            cwd=self.build_dir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def finish(self, info: dict[str, Any]) -> str | None:
        assert self.proc is not None
        self.proc.wait()
        self.log.seek(0)
        output = self.log.read().decode("utf-8", "replace")
        self.log.close()
        label, cmd = self.commands[0]
        info[f"{self.rule}_s"] = round(time.perf_counter() - self.started, 3)
        info[f"{self.rule}_mode"] = label
        if label == "pch" and "not used because" in output:  # -Winvalid-pch: gcc read the header instead
            info["pch"] = "not used: " + next(ln for ln in output.splitlines() if "not used because" in ln)
        if self.proc.returncode == 0:
            return None
        tried = [label]
        for label, later in self.commands[1:]:
            # after a lean step (prelude or PCH), any error retries: it may lack what the text needs; after
            # the slim text, only an error that may come from the headers it left out
            if tried[-1] not in RETRY_ANY and not (tried[-1] == "slim" and needs_full_headers(output)):
                break
            cmd = later() if callable(later) else later
            code, output, seconds = _run(cmd, self.build_dir)
            info[f"{self.rule}_s"] = round(info[f"{self.rule}_s"] + seconds, 3)
            info[f"{self.rule}_mode"] = " failed, ".join([*tried, label])
            tried.append(label)
            if code == 0:
                return None
        return f"{output.rstrip()}\nFAILED: {self.out}\n{cmd}"


def _job(
    build_dir: Path,
    variables: dict[str, str],
    rule: dict[str, str],
    out: str,
    src: str,
    rule_name: str,
    cache_root: Path,
    info: dict[str, Any],
) -> _Job:
    """The compile of one source: the slim ``.cu`` (then the full one), or ``main.cpp`` from the PCH."""
    ccache = use_ccache()
    template = rule["command"]
    full = expand(template, variables, ins=src, out=out)
    if rule_name == "cuda_compile":
        full = f"{shlex.quote(ccache)} {full}" if ccache else full
        text = Path(src).read_text(encoding="utf-8")
        commands: list[tuple[str, str]] = []
        slim = slim_cuda_text(text)
        shorter = [("lean", lean_cuda_text(text, src)), ("slim", slim and f'#line 1 "{src}"\n{slim}')]
        for label, body in [] if info.get("no_slim") else shorter[0 if lean_enabled() else 1 :]:
            if body is None:
                continue
            path = build_dir / f"cuda.{label}.cu"
            path.write_text(body, encoding="utf-8")
            flags = variables
            if label == "lean":  # torch's tensor operators without every ATen function: see LEAN_FUNCTIONS
                include = shlex.quote(str(lean_include_dir(build_dir)))
                flags = dict(variables, cuda_cflags=f"-I{include} {variables.get('cuda_cflags', '')}")
            cmd = expand(template, flags, ins=str(path), out=out)
            commands.append((label, f"{shlex.quote(ccache)} {cmd}" if ccache else cmd))
        commands.append(("full", full))
        return _Job(build_dir, rule_name, out, commands[:1] if info.get("no_retry") else commands, None)
    first, _, rest = Path(src).read_text(encoding="utf-8").partition("\n")
    if first.strip() != "#include <torch/extension.h>" or os.environ.get("DICE_PCH", "1") == "0":
        return _Job(
            build_dir, rule_name, out, [("plain", f"{shlex.quote(ccache)} {full}" if ccache else full)], None
        )

    def from_pch(include: str, label: str, text: str = rest) -> str | None:
        header = ensure_pch(variables["cxx"], variables.get("cflags", ""), cache_root, info, include)
        if header is None:
            return None
        fast = build_dir / f"{Path(src).stem}.{label}.cpp"
        fast.write_text(f'#include "{header}"\n#line 2 "{src}"\n{text}', encoding="utf-8")
        pch_vars = dict(variables, cflags=variables.get("cflags", "") + " -Winvalid-pch")
        return expand(template, pch_vars, ins=str(fast), out=out)

    def with_pch() -> list[tuple[str, Any]]:
        umbrella = [("pch", lambda: from_pch("torch/extension.h", "pch") or full)]
        body = lean_cpp_text(rest)
        if body is not None and lean_enabled():
            lean = from_pch("torch/python.h", "lean-pch", body)
            if lean is not None:
                return [("lean-pch", lean), *umbrella]
        first = from_pch("torch/extension.h", "pch")
        return [("pch", first)] if first is not None else [("plain", full)]

    return _Job(build_dir, rule_name, out, [("plain", full)], with_pch)


# ------------------------------------------------------------------------------------------------ PCH
def ensure_pch(
    cxx: str, cflags: str, cache_root: Path, info: dict[str, Any], include: str = "torch/extension.h"
) -> Path | None:
    """The header to include first instead of ``<torch/extension.h>``: ``<cache>/pch/<key>/dice_torch.h``
    (holding ``#include <include>``), whose ``.gch`` beside it is built here once (other workers wait on its
    lock); None with no gcc."""
    if not _is_gcc(cxx):
        return None
    flags = _NAME_FLAG.sub("", " " + cflags).strip()
    key = source_hash(PCH_VERSION, cxx, _compiler_id(cxx), flags, _torch_version(), include, length=16)
    root = Path(os.environ["DICE_PCH_DIR"]) if os.environ.get("DICE_PCH_DIR") else cache_root / "pch"
    folder = root / key
    header = folder / "dice_torch.h"
    gch = folder / "dice_torch.h.gch"
    if gch.is_file():
        info["pch"] = "used"
        return header
    if (folder / "failed").exists():
        return None
    if root.is_dir() and not folder.exists() and len(list(root.iterdir())) >= MAX_PCH_SETS:
        return None
    with key_lock(folder):
        if gch.is_file():
            info["pch"] = "used (waited)"
            return header
        header.write_text(f"#include <{include}>\n")
        tmp = folder / f"dice_torch.h.gch.tmp{os.getpid()}_{threading.get_ident()}"
        cmd = f"{cxx} -x c++-header {flags} {shlex.quote(str(header))} -o {shlex.quote(str(tmp))}"
        code, output, seconds = _run(cmd, folder)
        info["pch_build_s"] = round(seconds, 3)
        if code != 0:
            (folder / "failed").write_text(f"{cmd}\n{output}")
            tmp.unlink(missing_ok=True)
            return None
        os.replace(tmp, gch)
        info["pch"] = "built"
    return header


@lru_cache(maxsize=8)
def _compiler_id(cxx: str) -> str:
    proc = subprocess.run(f"{cxx} --version", shell=True, capture_output=True, text=True)
    exe = shutil.which(shlex.split(cxx)[-1]) or cxx
    with contextlib.suppress(OSError):
        exe = f"{os.path.realpath(exe)}:{os.stat(exe).st_mtime_ns}"
    return f"{exe}\n{proc.stdout}"


def _is_gcc(cxx: str) -> bool:
    text = _compiler_id(cxx)
    return "Free Software Foundation" in text or "g++" in text or "gcc" in text.lower()


def _torch_version() -> str:
    import torch

    return f"{torch.__version__}:{torch.__file__}"


@lru_cache(maxsize=1)
def toolchain_stamp() -> str:
    """What a recorded compile error depends on beside the sources and flags: the compilers and torch."""
    import torch.utils.cpp_extension as cpp_extension

    parts = [_torch_version(), _compiler_id(shlex.join([cpp_extension.get_cxx_compiler()]))]
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    with contextlib.suppress(OSError):
        parts.append(f"{os.path.realpath(nvcc)}:{os.stat(nvcc).st_mtime_ns}")
    return source_hash(*parts)


# ------------------------------------------------------------------------------------------------ ninja
def parse_ninja(
    text: str,
) -> tuple[dict[str, str], dict[str, dict[str, str]], list[tuple[str, str, list[str]]]] | None:
    """(variables, rules, builds) of the ``build.ninja`` torch writes; None when it holds an escape, a rule
    other than compile / cuda_compile / link, or anything else unknown."""
    if "$ " in text or "$:" in text or "$$" in text:
        return None
    variables: dict[str, str] = {}
    rules: dict[str, dict[str, str]] = {}
    builds: list[tuple[str, str, list[str]]] = []
    rule: str | None = None
    for line in text.splitlines():
        if not line.strip():
            rule = None
        elif line.startswith("rule "):
            rule = line[5:].strip()
            rules[rule] = {}
        elif line.startswith((" ", "\t")) and rule is not None:
            name, _, value = line.strip().partition("=")
            rules[rule][name.strip()] = value.strip()
        elif line.startswith("build "):
            out, _, rest = line[6:].partition(":")
            words = rest.split()
            if not words:
                return None
            builds.append((out.strip(), words[0], words[1:]))
        elif line.startswith("default "):
            continue
        elif "=" in line:
            name, _, value = line.partition("=")
            variables[name.strip()] = value.strip()
        else:
            return None
    known = {"compile", "cuda_compile", "link"}
    if not set(rules) <= known or {b[1] for b in builds} - known or sum(b[1] == "link" for b in builds) != 1:
        return None
    if any(len(ins) != 1 for out, r, ins in builds if r != "link"):
        return None
    return variables, rules, builds


def expand(template: str, variables: dict[str, str], *, ins: str, out: str) -> str:
    """A ninja rule's command with ``$in``, ``$out`` and the file's variables substituted."""
    values = {**variables, "in": ins, "out": out}
    return re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), ""), template)


def _run(cmd: str, cwd: Path) -> tuple[int, str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.communicate()[0].decode("utf-8", "replace")
    return proc.returncode, output, time.perf_counter() - started


def _record_failure(build_dir: Path, message: str, output: str, code: int = 1) -> None:
    """Keep a compile error for the next attempt, unless it may not happen again (a signal, memory)."""
    if code < 0 or _TRANSIENT.search(output) or "error" not in output.lower():
        return
    with contextlib.suppress(OSError):
        (build_dir / FAILED_FILE).write_text(json.dumps({"message": message, "toolchain": toolchain_stamp()}))
