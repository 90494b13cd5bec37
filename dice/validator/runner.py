"""A runner: the one process a candidate's code runs in, forked from the zygote for that candidate alone.

The judge (:mod:`dice.validator.judge`) never imports a candidate. It forks a runner through the zygote
(:mod:`dice.validator.zygote`), which imports the candidate (building its extensions), constructs
``ModelNew`` as KernelBench does and then only does what the judge asks over its socket, one JSON line per
request and per reply, each reply carrying its request's ``id``:

- ``inputs`` / ``outputs`` (with file descriptors on the CPU): open the judge's shared buffers
  (:mod:`dice.validator.shared_tensors`): the forward's arguments, and the slots its outputs are copied into;
- ``trial``: one forward on the shared inputs, the guards that need the candidate's own objects (thread
  count, output types, dtypes, aliasing, in :mod:`dice.validator.runtime_guards`), the outputs copied into
  the slots;
- ``launch``: one profiled forward (which kernels ran);
- ``run`` / ``noop``: a timed forward, or the empty round trip the judge subtracts: outputs copied, the device
  synchronised, then ``done``;
- ``check``: the library functions replaced since the import; ``exit``.

What this process reports is what a candidate could forge (it runs here): the judge treats it as a claim
that can only make a verdict worse (a rejection, a mismatch). What makes a verdict ``correct`` -- the outputs
in the slots, the inputs left intact, the seeds, the times -- the judge reads from its own memory and clock.

The runner confines itself further before the candidate is imported (Landlock where the kernel has it:
writes only to its task folder), gets a private CuPy cache, and is killed with its process group when the
task ends; it is never reused. The extension cache is read-only to it: a ``load_inline`` the cache cannot
serve is sent to the judge as a ``build`` event and built by a builder (:mod:`dice.validator.builder`),
and a cached ``.so`` is loaded only when its content hash matches the builder's manifest.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import io
import json
import os
import re
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from dice.validator.dependence import Watch
from dice.validator.verdict import FLAG_SANDBOX_DENIED

MAX_REQUEST = 64 << 20
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


class Channel:
    """JSON lines over the runner's socket (file descriptors ride along on the CPU)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._fds: list[int] = []
        self._builds = 0

    def receive(self) -> tuple[dict[str, Any], list[int]]:
        while b"\n" not in self._buffer:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 16)
            if not data:
                raise EOFError("the judge closed the channel")
            self._buffer += data
            self._fds += fds
            if len(self._buffer) > MAX_REQUEST:
                raise ValueError("request too large")
        line, self._buffer = self._buffer.split(b"\n", 1)
        fds, self._fds = self._fds, []
        return json.loads(line), fds

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def build(self, call: dict[str, Any]) -> dict[str, Any]:
        """Ask the judge to have ``call`` (a ``load_inline`` call as plain data) built into the cache, which
        this process cannot write (:mod:`dice.validator.builder`); the outcome ``{"ok", "message", ...}``."""
        self._builds += 1
        self.send({"event": "build", "request": self._builds, "call": call})
        reply, _fds = self.receive()
        if reply.get("op") != "built" or reply.get("request") != self._builds:
            raise RuntimeError(f"the judge answered a build request with {reply.get('op')!r}")
        return reply


def serve(fd: int, mode: str, args: dict[str, Any]) -> int:
    """The runner's main: ``mode`` "kernelbench" (the protocol above) or "prebuild" (a batched build,
    whose discovery imports candidates)."""
    channel = open_channel(fd)
    try:
        confine(args)
        if mode == "prebuild":
            lock_down(args)
            return _discover(channel, args)
        if mode == "kernelbench":
            return KernelBenchRunner(channel, args).serve()
        channel.send(
            {"id": 0, "event": "error", "status": "runtime_error", "message": f"unknown mode {mode}"}
        )
    except Exception as exc:  # noqa: BLE001 - reported, then this process ends
        with contextlib.suppress(OSError):
            channel.send(error_reply(0, "runtime_error", f"runner failed: {type(exc).__name__}: {exc}"))
    return 1


def open_channel(fd: int) -> Channel:
    """The runner's channel on ``fd``; every other descriptor it inherited (above the standard three)
    closed."""
    sock = socket.socket(fileno=fd)
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)
    return Channel(sock)


def confine(args: dict[str, Any]) -> None:
    """Before any candidate code: a private task folder, HOME, TMPDIR, CuPy cache and torch extensions
    folder (``cpp_extension.load``: a private build)."""
    from dice.validator.sandbox import enter_task_dir

    task_dir = Path(args["task_dir"])
    enter_task_dir(task_dir, TORCH_EXTENSIONS_DIR=str(task_dir / "torch_extensions"))
    use_cupy_cache(task_dir / "cupy")


def use_cupy_cache(folder: Path) -> None:
    """CuPy's kernel cache in ``folder``. CuPy 14 reads ``CUPY_CACHE_DIR`` once, when the zygote imported it,
    into a cache backend of its own; the variable alone would leave this process writing the worker's
    cache, which its Landlock layer makes read-only (seen on the H200: EACCES in CuPy's compile). So the
    backend is replaced too (a private CuPy function: there is no public one; an older CuPy, without it,
    reads the variable at each compile)."""
    os.environ["CUPY_CACHE_DIR"] = str(folder)
    compiler = sys.modules.get("cupy.cuda.compiler")
    backend = getattr(compiler, "_DiskKernelCacheBackend", None)
    setter = getattr(compiler, "_set_kernel_cache_backend", None)
    if backend is not None and setter is not None:
        setter(backend(str(folder)))


def lock_down(args: dict[str, Any]) -> None:
    """Landlock on top of the worker's sandbox where available: writes only to the task folder (the build
    cache is the builder's); seccomp: no new socket but netlink. Applied after CUDA started
    in the runner and before the candidate is imported."""
    from dice.validator.sandbox import apply_landlock, apply_seccomp, landlock_abi, seccomp_available

    if args.get("landlock") and landlock_abi() > 0:
        apply_landlock([Path(p) for p in args.get("writable") or []] + [Path(args["task_dir"])])
    if args.get("landlock") and seccomp_available():
        apply_seccomp(unix=True)  # its channel to the judge exists already


def error_reply(request_id: int, status: str, message: str, log: str = "") -> dict[str, Any]:
    return {"id": request_id, "event": "error", "status": status, "message": message, "log": log[-20000:]}


def _discover(channel: Channel, args: dict[str, Any]) -> int:
    """A batched prebuild's discovery (it imports the candidates): the calls as plain data, for the
    builder; a call that is not plain data is left to its candidate's own task."""
    from dice.validator.batchbuild import call_to_json, discover_all

    cand_srcs = list(args.get("cand_srcs") or [])
    calls, problems = discover_all(Path(args["task_dir"]), cand_srcs, args.get("ref_srcs"))
    plain = [data for call in calls if (data := call_to_json(call)) is not None]
    for i in range(len(cand_srcs)):
        if i not in problems and not any(d["candidate"] == i for d in plain):
            problems[i] = "its load_inline arguments are not plain data"
    channel.send(
        {"id": 0, "event": "discovered", "calls": plain, "problems": {str(k): v for k, v in problems.items()}}
    )
    return 0


def by_value(spec: dict[str, Any]) -> Any:
    """An input the judge sent by value: plain JSON, or pickled by the judge (this process trusts the judge;
    nothing it sends back is ever unpickled)."""
    import pickle

    if "pickle" in spec:
        return pickle.loads(base64.b64decode(spec["pickle"]))  # noqa: S301 - written by the judge
    return spec["value"]


def load_value(text: str) -> Any:
    """Values the judge sends with ``torch.save`` (init inputs): loaded with ``weights_only``."""
    import torch

    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)


class Phases:
    """Seconds per step of a runner's start (its ``ready`` reply carries them)."""

    def __init__(self) -> None:
        import time

        self.times: dict[str, float] = {}
        self.mark = time.perf_counter()

    def lap(self, name: str) -> None:
        import time

        now = time.perf_counter()
        self.times[name] = round(now - self.mark, 3)
        self.mark = now


class KernelBenchRunner:
    def __init__(self, channel: Channel, args: dict[str, Any]) -> None:
        import torch

        self.channel = channel
        self.args = args
        self.device = torch.device(args.get("device", "cuda"))
        self.inputs: list[Any] = []
        self._by_value: list[int] = []
        self.slots: list[Any] = []
        self.last_out: Any = None
        self.model: Any = None
        self.watch = Watch()

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def serve(self) -> int:
        if not self._start():
            return 1
        handlers = self.handlers()
        import torch

        while True:
            request, fds = self.channel.receive()
            rid = int(request.get("id", -1))
            op = request.get("op")
            if op == "exit":
                return 0
            handler = handlers.get(str(op))
            try:
                if handler is None:
                    raise ValueError(f"unknown request {op!r}")
                with torch.no_grad():
                    reply = handler(request, fds)
            except Exception as exc:  # noqa: BLE001 - the candidate's failure (or a CUDA error): reported
                self.channel.send(error_reply(rid, "runtime_error", short(exc), traceback.format_exc()))
                return 1
            self.channel.send({"id": rid, **reply})

    def handlers(self) -> dict[str, Any]:
        return {
            "inputs": self._inputs,
            "values": self._values,
            "outputs": self._outputs,
            "trial": self._trial,
            "launch": self._launch,
            "run": self._run,
            "noop": self._noop,
            "check": self._check,
            "dependence": self._dependence,
        }

    def start_confined(self) -> Phases:
        """This process's CUDA start, then its Landlock and seccomp layers; the phases so far."""
        import torch

        phases = Phases()
        if self.device.type == "cuda":
            torch.cuda.init()
            torch.cuda.set_device(self.device)
        phases.lap("cuda")
        lock_down(self.args)
        phases.lap("sandbox")
        return phases

    def _start(self) -> bool:
        """Import the candidate and construct ``ModelNew``; the ``ready`` reply (request id 0)."""
        import time

        from dice.validator.builds import built_kernel_names, import_source
        from dice.validator.context import Integrity
        from dice.validator.kbsetup import construct_model

        phases = self.start_confined()
        lap = phases.lap
        import torch._dynamo  # noqa: F401 - its import wraps torch.manual_seed: before the snapshot
        import torch.profiler  # noqa: F401 - before the snapshot, as the candidate's import may use it
        import torch.utils.cpp_extension  # noqa: F401

        lap("imports")

        integrity = Integrity()
        self.integrity = integrity
        records: list[dict[str, Any]] = []
        stage = "building the candidate (import, load_inline)"
        src = str(self.args["cand_src"])
        try:
            with _extension_builds(self.args, records, self.channel, self.watch):
                cand = import_source(src, Path(self.args["task_dir"]) / "candidate.py", "dice_candidate")
                lap("candidate")
                stage = "constructing ModelNew"
                init_inputs = load_value(self.args["init_inputs"])
                self.model, construction = construct_model(
                    cand.ModelNew, init_inputs, self.device, int(self.args["seed"])
                )
        except Exception as exc:  # noqa: BLE001 - a build or import failure is the candidate's compile error
            status = "compile_error" if stage.startswith("building") else "runtime_error"
            reply = error_reply(0, status, f"{stage} failed: {short(exc)}", traceback.format_exc())
            denied = sandbox_denial(exc, Path(self.args["task_dir"]))
            if denied is not None:  # the code may be right: say the sandbox stopped it, not the compiler
                reply["message"] = (
                    f"{stage} failed: the validator's sandbox denied access to {denied} (a candidate may "
                    f"write only in its task folder): {short(exc)}"
                )
                reply["flags"] = [FLAG_SANDBOX_DENIED]
            self.channel.send({**reply, "records": _plain_records(records)})
            return False
        self.channel.send(
            {
                "id": 0,
                "event": "ready",
                "records": _plain_records(records),
                "kernel_names": built_kernel_names(records, src),
                "construction": construction,
                "replaced": integrity.violations(),
                "phases": {**phases.times, "construction": round(time.perf_counter() - phases.mark, 3)},
            }
        )
        return True

    # ------------------------------------------------------------------------------------ the requests
    def _inputs(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        from dice.validator.shared_tensors import open_buffers

        specs = request["inputs"]
        tensors = iter(open_buffers([s for s in specs if "tensor" in s], fds, self.device))
        self.inputs = [next(tensors) if "tensor" in s else by_value(s) for s in specs]
        self._by_value = [i for i, s in enumerate(specs) if "tensor" not in s]
        return {"event": "ok"}

    def _values(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """New values for the inputs sent by value (the shared tensors stay)."""
        values = list(request["values"])
        if len(values) != len(self._by_value):
            raise ValueError(f"{len(values)} values for {len(self._by_value)} inputs sent by value")
        for i, value in zip(self._by_value, values, strict=True):
            self.inputs[i] = by_value(value)
        return {"event": "ok"}

    def _outputs(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        from dice.validator.shared_tensors import open_buffers

        self.slots = open_buffers(request["outputs"], fds, self.device)
        return {"event": "ok"}

    def _trial(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        import torch

        from dice.validator.runtime_guards import RUNTIME_GUARDS, Trial

        ref_out = [
            torch.empty(s["shape"], dtype=getattr(torch, s["dtype"]), device="meta") for s in request["ref"]
        ]
        before = threading.active_count()
        out = self.model(*self.inputs)
        self.sync()
        trial = Trial(
            inputs=self.inputs,
            saved=self.inputs,
            ref_mutated=[True] * len(self.inputs),  # the judge checks the inputs, in its own memory
            ref_aliases=bool(request.get("ref_aliases")),
            ref_out=ref_out,
            new_out=out,
            device_type=self.device.type,
            threads_before=before,
            threads_after=threading.active_count(),
        )
        for guard in RUNTIME_GUARDS:
            reason = guard.check(trial) if guard.observes is Trial else None
            if reason is not None:
                return {"event": "trial", "rejection": {"guard": guard.name, "reason": reason}}
        return {"event": "trial", "rejection": None, **self._deliver(out)}

    def _deliver(self, out: Any) -> dict[str, Any]:
        """Copy the outputs into the judge's slots: ``{"mismatch": message | None, "values": [...]}``
        (values: the non-tensor leaves)."""
        import torch

        from dice.validator.gpu import flatten

        leaves = flatten(out)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        values = [
            x if isinstance(x, (int, float, bool, str)) or x is None else repr(x)
            for x in leaves
            if not isinstance(x, torch.Tensor)
        ]
        if len(tensors) != len(self.slots):
            return {
                "mismatch": f"{len(tensors)} output tensor(s), the reference returns {len(self.slots)}",
                "values": values,
            }
        for i, (x, slot) in enumerate(zip(tensors, self.slots, strict=True)):
            if x.shape != slot.shape:
                return {
                    "mismatch": f"output {i}: shape mismatch: expected {list(slot.shape)}, got "
                    f"{list(x.shape)}",
                    "values": values,
                }
            if x.dtype != slot.dtype:
                return {
                    "mismatch": f"output {i}: dtype mismatch (precision downgrade?): expected "
                    f"{slot.dtype}, got {x.dtype}",
                    "values": values,
                }
            slot.copy_(x)
        self.last_out = tensors
        self.sync()
        return {"mismatch": None, "values": values}

    def _launch(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if self.device.type != "cuda":  # emulated: what the stand-ins say ran (tests), else nothing known
            standins = sys.modules.get("dice_standins")
            profile = getattr(standins, "launch_profile", None)
            return {"event": "launch", "profile": profile() if profile is not None else None}
        found = launched_kernels(self.model, self.inputs, list(request.get("kernel_names") or []))
        if found is None:
            return {"event": "launch", "profile": None}
        ours, total, names = found
        return {"event": "launch", "profile": {"ours": ours, "total": total, "names": sorted(names)}}

    def _run(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        out = self.model(*self.inputs)
        for x, slot in zip(_tensor_leaves(out), self.slots, strict=False):
            slot.copy_(x)
        self.sync()
        self.last_out = out
        return {"event": "done"}

    def _noop(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        for x, slot in zip(_tensor_leaves(self.last_out), self.slots, strict=False):
            slot.copy_(x)
        self.sync()
        return {"event": "done"}

    def _dependence(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """One forward with every watched extension call's floating results shifted by noise; its outputs
        in the slots, and how many results were shifted (the judge decides whether they mattered)."""
        self.watch.start(int(request["seed"]))
        try:
            out = self.model(*self.inputs)
            self.sync()
        except Exception as exc:  # noqa: BLE001 - forward fails on the shifted results: they are used
            return {"event": "dependence", "raised": short(exc), "perturbed": self.watch.stop()}
        perturbed = self.watch.stop()
        return {"event": "dependence", "raised": None, "perturbed": perturbed, **self._deliver(out)}

    def _check(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        return {"event": "check", "replaced": self.integrity.violations()}


def launched_kernels(
    model_new: Any, inputs: list[Any], kernel_names: list[str]
) -> tuple[float, float, set[str]] | None:
    """(custom kernel time, total kernel time, kernel names) of one profiled forward, or None without data."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model_new(*inputs)
        torch.cuda.synchronize()
    patterns = [re.compile(rf"(?<![\w]){re.escape(n)}(?![\w])") for n in kernel_names]
    ours = total = 0.0
    names: set[str] = set()
    for event in prof.events():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if event.name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset")):
            continue
        duration = float(event.time_range.elapsed_us())
        names.add(event.name.split("(")[0][:80])
        total += duration
        if any(p.search(event.name) for p in patterns):
            ours += max(duration, 1e-3)
    if not names:
        return None
    return ours, total, names


def _tensor_leaves(out: Any) -> list[Any]:
    import torch

    from dice.validator.gpu import flatten

    return [x for x in flatten(out) if isinstance(x, torch.Tensor)]


def sandbox_denial(exc: BaseException | None, task_dir: Path) -> str | None:
    """The path the sandbox refused, when ``exc`` or an exception that led to it is a permission error
    (EACCES, EPERM, EROFS: Landlock, seccomp, bubblewrap's read-only binds) on a path outside ``task_dir``;
    None for anything else (a denial inside the task folder is the candidate's own doing)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DENIED and exc.filename is not None:
            path = Path(os.fsdecode(exc.filename))
            if not _inside(path, task_dir):  # a relative path is the task folder's (the cwd)
                return str(path)
        exc = exc.__cause__ or exc.__context__
    return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def short(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def _plain_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("name", "key", "cached", "batched", "fallback", "seconds", "emulated")
    out = [{k: r[k] for k in keep if k in r} for r in records]
    for r, src in zip(out, records, strict=True):
        r["sources"] = [
            str(s)
            for s in (src["sources"] if isinstance(src["sources"], (list, tuple)) else [src["sources"]])
        ]
    return out


def load_standins(path: str, name: str) -> Any:
    """The emulated path's stand-ins for compiled code (the CPU tests): the file ``path`` as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _extension_builds(  # noqa: ANN202
    args: dict[str, Any], records: list[dict[str, Any]], channel: Channel, watch: Any
):
    """``load_inline`` through the build cache (read-only here: a miss is built by the builder, through
    the judge), or (``emulate`` set: the CPU tests) through stand-ins; the functions of every module it
    returns watched (:class:`dice.validator.dependence.Watch`)."""
    import torch.utils.cpp_extension as cpp_extension

    from dice.validator.builds import cached_extension_builds

    standins = args.get("emulated_extensions")
    if not standins:
        private = Path(args["task_dir"]) / "private_ext"
        with cached_extension_builds(Path(args["cache_dir"]), records, channel.build, private):
            inner = cpp_extension.load_inline
            cpp_extension.load_inline = lambda *a, **kw: watch.module(inner(*a, **kw))
            try:
                yield
            finally:
                cpp_extension.load_inline = inner
        return
    import types

    module = load_standins(standins, "dice_standins")
    sys.modules["dice_standins"] = module

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *a: Any, **kw: Any) -> Any:
        functions = kw.get("functions") or []
        functions = [functions] if isinstance(functions, str) else list(functions)
        records.append(
            {
                "name": name,
                "key": "emulated",
                "cached": True,
                "emulated": True,
                "sources": cuda_sources or cpp_sources,
                "seconds": 0.0,
            }
        )
        return watch.module(types.SimpleNamespace(**{f: getattr(module, f) for f in functions}))

    original = cpp_extension.load_inline
    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original
