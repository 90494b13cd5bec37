"""The KernelBench run with the judge apart from the candidate: this process never imports a candidate.

The judge (the worker process) imports the reference, builds ``Model``, draws every input from seeds it
picks at random for this run (``secrets``: nothing a candidate can know or replay), runs the reference,
keeps its outputs, compares and times. The candidate runs in a runner forked for it alone by the zygote
(:mod:`dice.validator.runner`, :mod:`dice.validator.zygote`), which imports it, builds its extensions and
constructs ``ModelNew``; it sees its inputs and writes its outputs only through buffers the judge owns
(:mod:`dice.validator.shared_tensors`: CUDA IPC), and is killed with its process group when the task ends.

- **Correctness**: per trial, fresh inputs (same buffers, new values), the reference on the judge's own copy,
  the output slots poisoned (NaN), ``trial`` sent; after the runner's reply the judge reads the slots and
  its inputs: :func:`dice.validator.gpu.compare_outputs`, ``inputs_mutated`` and ``outputs_cached`` on its
  own memory. The guards that need the candidate's objects (thread count, output types and dtypes,
  aliasing, replaced library functions, the profiled kernel launch) are observed in the runner and can only
  reject.
- **Timing from outside**: per round the judge writes an input set into the buffers, poisons the slots,
  flushes L2, synchronises its device, then sends ``run`` and stops its clock at ``done`` (the runner copies
  its outputs into the slots and synchronises first). The round trip of ``noop`` (the same copy and
  synchronisation, no forward) is the baseline subtracted. After each round the judge checks the slots
  against the reference's output for that set: a runner that says ``done`` before its work finished reads
  back poison and is rejected (``outputs_not_ready``), so finishing early gains nothing. The reference is
  timed in this process the same way (host clock around the call and a device synchronisation, an empty
  synchronisation subtracted).
- **The channel**: replies carry their request's id; a reply that is not valid JSON, has another id or
  another event than asked is a protocol violation (``rejected``, the runner killed). The judge's own result
  pipe to the pool is not in the runner's reach (the zygote is started with only its control socket).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import secrets
import signal
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dice.validator.runtime_guards import rejected, tensors
from dice.validator.verdict import Verdict

if TYPE_CHECKING:
    from dice.validator.context import WorkerContext

MAX_REPLY = 32 << 20
REPLY_TIMEOUT_S = 3600.0  # the pool's phase deadlines end a hung task first (they kill this worker)


class ProtocolViolation(Exception):
    """The runner's reply was not the one asked for."""


class RunnerFailed(Exception):
    """The runner reported an error or died: ``status`` (runtime_error | compile_error), message, log."""

    def __init__(self, status: str, message: str, log: str = "", records: list[Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.log, self.records = status, message, log, records or []


MAX_BUILDS = 64  # build requests one runner may make


class RunnerProcess:
    """The judge's handle on one runner (or, ``role="builder"``, a builder): id-checked requests, then
    :meth:`close` (kill its group). ``builder`` set: the runner's ``build`` events (a ``load_inline`` the
    read-only cache cannot serve) are answered with its outcome (:func:`build_for_runner`)."""

    def __init__(
        self,
        zygote: Any,
        mode: str,
        args: dict[str, Any],
        role: str = "runner",
        builder: Callable[[Any], dict[str, Any]] | None = None,
    ) -> None:
        self.zygote = zygote
        self.pid, self.sock = zygote.spawn(mode, args, role)
        self.sock.settimeout(REPLY_TIMEOUT_S)
        self.builder = builder
        self.builds = 0
        self._buffer = b""
        self._next_id = 1

    def receive(self, request_id: int, event: str) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                raise RunnerFailed("runtime_error", self._death())
            self._buffer += data
            if len(self._buffer) > MAX_REPLY:
                raise ProtocolViolation(f"a reply of over {MAX_REPLY >> 20} MiB")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            raise ProtocolViolation("a reply that is not JSON") from None
        if isinstance(reply, dict) and reply.get("event") == "build" and "id" not in reply:
            self._answer_build(reply)
            return self.receive(request_id, event)
        if not isinstance(reply, dict) or reply.get("id") != request_id:
            got = reply.get("id") if isinstance(reply, dict) else None
            raise ProtocolViolation(f"a reply for request {got!r} where {request_id} was asked")
        if reply.get("event") == "error":
            raise RunnerFailed(
                "compile_error" if reply.get("status") == "compile_error" else "runtime_error",
                str(reply.get("message", ""))[:2000],
                str(reply.get("log", ""))[-20000:],
                reply.get("records") if isinstance(reply.get("records"), list) else None,
            )
        if reply.get("event") != event:
            raise ProtocolViolation(f"a {reply.get('event')!r} reply where {event!r} was asked")
        return reply

    def _answer_build(self, message: dict[str, Any]) -> None:
        """A runner's build request: built by a builder, the outcome sent back (its own compile error
        included: the runner raises it from ``load_inline``)."""
        self.builds += 1
        if self.builder is None or self.builds > MAX_BUILDS:
            raise ProtocolViolation(f"a build request where none may be made (request {self.builds})")
        outcome = self.builder(message.get("call"))
        reply = {**outcome, "op": "built", "request": message.get("request")}
        try:
            self.sock.sendall((json.dumps(reply) + "\n").encode())
        except OSError:
            raise RunnerFailed("runtime_error", self._death()) from None

    def request(self, op: str, event: str, fds: list[int] | None = None, **fields: Any) -> dict[str, Any]:
        rid = self._next_id
        self._next_id += 1
        data = (json.dumps({"id": rid, "op": op, **fields}) + "\n").encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.sendall(data)
        except OSError:
            raise RunnerFailed("runtime_error", self._death()) from None
        return self.receive(rid, event)

    def _death(self) -> str:
        status = self.zygote.wait(self.pid, 5.0)
        if status.get("signal"):
            try:
                name = signal.Signals(status["signal"]).name
            except ValueError:
                name = ""
            return f"the candidate's process was killed by signal {status['signal']} {name}".strip()
        if status.get("exited"):
            return f"the candidate's process exited (code {status.get('code')})"
        return "the candidate's process closed its channel"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(b'{"op": "exit"}\n')
        self.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.zygote.wait(self.pid, 5.0)


def dump_value(value: Any) -> str:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def poison(slots: list[Any]) -> None:
    for s in slots:
        if s.is_floating_point() or s.is_complex():
            s.fill_(float("nan"))
        elif s.dtype.is_signed or s.dtype != s.dtype:
            s.fill_(-7)
        else:
            s.fill_(7)


class Session:
    """One candidate's run: the runner, the shared buffers, the input layout it was given."""

    def __init__(self, runner: RunnerProcess, device: Any) -> None:
        self.runner = runner
        self.device = device
        self.in_buffers: Any = None
        self.out_buffers: Any = None
        self._in_layout: Any = None
        self._out_layout: Any = None

    def put_inputs(self, inputs: list[Any]) -> list[Any]:
        """Write ``inputs`` into the shared buffers (new buffers when the layout changed); the judge's views
        of them, in argument order (non-tensors as they are)."""
        import torch

        from dice.validator.shared_tensors import SharedBuffers

        layout = [
            ("t", str(x.dtype), tuple(x.shape), x.stride(), x.storage_offset(), x.untyped_storage().nbytes())
            if isinstance(x, torch.Tensor)
            else ("v", repr(x))
            for x in inputs
        ]
        if layout != self._in_layout:
            values = [x for x in inputs if not isinstance(x, torch.Tensor)]
            if any(not isinstance(v, (int, float, bool, str, type(None))) for v in values):
                raise ValueError("get_inputs() returned a value that is neither a tensor nor a plain number")
            if self.in_buffers is not None:
                self.in_buffers.close()
            self.in_buffers = SharedBuffers([x for x in inputs if isinstance(x, torch.Tensor)], self.device)
            described = iter(self.in_buffers.descriptors())
            specs = [
                {"tensor": True, **next(described)} if isinstance(x, torch.Tensor) else {"value": x}
                for x in inputs
            ]
            self.runner.request("inputs", "ok", fds=self.in_buffers.fds, inputs=specs)
            self._in_layout = layout
        shared = iter(self.in_buffers.tensors)
        views = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                view = next(shared)
                view.copy_(x)
                views.append(view)
            else:
                views.append(x)
        return views

    def slots_like(self, ref_out: Any) -> list[Any]:
        """The output slots, shaped like the reference's output tensors (new ones when they changed)."""
        import torch

        from dice.validator.shared_tensors import SharedBuffers

        refs = tensors(ref_out)
        layout = [(str(r.dtype), tuple(r.shape)) for r in refs]
        if layout != self._out_layout:
            if self.out_buffers is not None:
                self.out_buffers.close()
            like = [torch.empty(r.shape, dtype=r.dtype, device="meta") for r in refs]
            self.out_buffers = SharedBuffers(like, self.device)
            self.runner.request(
                "outputs", "ok", fds=self.out_buffers.fds, outputs=self.out_buffers.descriptors()
            )
            self._out_layout = layout
        return self.out_buffers.tensors

    def close(self) -> None:
        self.runner.close()
        for buffers in (self.in_buffers, self.out_buffers):
            if buffers is not None:
                buffers.close()


def rebuild(ref_out: Any, slot_values: list[Any], values: list[Any]) -> Any:
    """The candidate's output in the reference's structure: tensors from the slots, other leaves from the
    runner's reply."""
    import torch

    slots, others = iter(slot_values), iter(values)

    def leaf(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            return type(x)(leaf(y) for y in x)
        if isinstance(x, torch.Tensor):
            return next(slots)
        return next(others, None)

    return leaf(ref_out)


def meta(out: Any) -> list[dict[str, Any]]:
    return [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in tensors(out)]


def random_seeds(n: int) -> list[int]:
    """Seeds nothing in a candidate can know or replay (the run's log lists them afterwards)."""
    return [secrets.randbelow(2**31) for _ in range(n)]


def host_times(fn: Any, device: Any, rounds: int, before: Any = None) -> list[float]:
    """Milliseconds of ``fn()`` between device synchronisations on the host clock (``before()`` untimed)."""
    times = []
    for i in range(rounds):
        if before is not None:
            before(i)
        sync(device)
        t0 = time.perf_counter()
        fn(i)
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def summary(times: list[float], baseline: list[float]) -> dict[str, float]:
    base = statistics.median(baseline) if baseline else 0.0
    net = [max(t - base, 1e-4) for t in times]
    return {
        "mean_ms": statistics.fmean(net),
        "median_ms": statistics.median(net),
        "std_ms": statistics.pstdev(net),
        "baseline_ms": base,
    }


def runner_args(ctx: WorkerContext, task_dir: Path) -> dict[str, Any]:
    """What every runner gets: its task folder (the one folder its Landlock layer leaves writable) and
    the build cache (read-only to it)."""
    from dice.validator import sandbox

    (ctx.cache_dir / "torch_ext").mkdir(parents=True, exist_ok=True)
    return {
        "task_dir": str(task_dir),
        "cache_dir": str(ctx.cache_dir),
        "writable": [],
        "landlock": sandbox.landlock_abi() > 0,
    }


def builder_args(ctx: WorkerContext, task_dir: Path) -> dict[str, Any]:
    """What a builder gets: :func:`runner_args` with the cache folders it writes (the extension cache, the
    PCH and ccache folders; not CuPy's or nvcc's caches, the GPU lock or the worker's own folder)."""
    cache = ctx.cache_dir
    writable = [cache / "torch_ext", Path(os.environ.get("DICE_PCH_DIR") or cache / "pch")]
    if os.environ.get("CCACHE_DIR"):
        writable.append(Path(os.environ["CCACHE_DIR"]))
    for path in writable:
        path.mkdir(parents=True, exist_ok=True)
    return {**runner_args(ctx, task_dir), "writable": [str(p) for p in writable]}


def build_for_runner(ctx: WorkerContext, call: Any) -> dict[str, Any]:
    """A runner's ``load_inline`` call built by a builder of its own (:mod:`dice.validator.builder`):
    ``{"ok", "message", "build"}``; a builder that fails is a failed build."""
    builder = None
    try:
        builder = RunnerProcess(
            ctx.zygote, "build", {**builder_args(ctx, ctx.task_dir()), "call": call}, "builder"
        )
        reply = builder.receive(0, "built")
    except (RunnerFailed, ProtocolViolation) as exc:
        return {"ok": False, "message": f"the extension builder failed: {exc}"}
    finally:
        if builder is not None:
            builder.close()
    outcome = {"ok": bool(reply.get("ok")), "message": str(reply.get("message") or "")[:20000]}
    for field in ("build", "fallback"):
        if reply.get(field):
            outcome[field] = reply[field]
    return outcome


def task_args(
    ctx: WorkerContext, cand_src: str, task_dir: Path, init_inputs: list[Any], device: Any
) -> dict[str, Any]:
    """A KernelBench runner's arguments: :func:`runner_args` and the candidate, device, seed, init inputs."""
    from dice.validator.kbsetup import SEED

    return {
        **runner_args(ctx, task_dir),
        "cand_src": cand_src,
        "device": str(device),
        "seed": SEED,
        "init_inputs": dump_value(init_inputs),
        "emulated_extensions": os.environ.get("DICE_EMULATED_EXTENSIONS") if ctx.emulated else None,
    }


def runner_verdict(exc: RunnerFailed | ProtocolViolation, log: str = "") -> Verdict:
    if isinstance(exc, ProtocolViolation):
        return rejected("protocol_violation", f"the candidate's process sent {exc}", log=log)
    return Verdict(
        exc.status, exc.status != "compile_error", message=exc.message, log=(log + "\n" + exc.log).strip()
    )


def runner_rejection(claim: Any) -> Verdict:
    """The verdict of a guard the runner saw fire (``{"guard", "reason"}``); anything else it sends there is
    a protocol violation."""
    from dice.validator.runtime_guards import RUNTIME_GUARDS

    names = {g.name for g in RUNTIME_GUARDS}
    if not isinstance(claim, dict) or claim.get("guard") not in names:
        raise ProtocolViolation("a rejection naming no guard")
    return rejected(str(claim["guard"]), str(claim.get("reason", ""))[:500])


BASELINE_ROUNDS = 20


def time_candidate(
    session: Session,
    arg_sets: list[list[Any]],
    expected: list[Any],
    flush: Any,
    tolerance: tuple[float, float],
    *,
    warmup: int,
    trials: int,
) -> dict[str, float] | Verdict:
    """Rounds of ``run`` timed on this process's clock from "go" to "done", the outputs checked after each
    (a wrong read-back is ``outputs_not_ready``: the runner said done before its outputs were there), minus
    the median ``noop`` round trip. The times, or the rejection."""
    from dice.validator.gpu import compare_outputs, flatten

    slots = session.slots_like(expected[0])
    count = len(arg_sets)

    def prepare(i: int) -> None:
        session.put_inputs(arg_sets[i % count])
        poison(slots)
        flush()
        sync(session.device)

    times = []
    for i in range(warmup + trials):
        prepare(i)
        t0 = time.perf_counter()
        session.runner.request("run", "done")
        elapsed = (time.perf_counter() - t0) * 1e3
        want = expected[i % count]
        got = rebuild(want, slots, [x for x in flatten(want) if not _is_tensor(x)])
        cmp = compare_outputs(got, want, atol=tolerance[0], rtol=tolerance[1])
        if not cmp.correct:
            return rejected(
                "outputs_not_ready",
                f"the outputs read back after 'done' are wrong ({cmp.message})",
                where=f" (timing round {i + 1})",
            )
        if i >= warmup:
            times.append(elapsed)
    baseline = []
    for i in range(BASELINE_ROUNDS):
        prepare(i)
        t0 = time.perf_counter()
        session.runner.request("noop", "done")
        baseline.append((time.perf_counter() - t0) * 1e3)
    return summary(times, baseline)


def time_reference(
    model: Any, arg_sets: list[list[Any]], device: Any, flush: Any, *, warmup: int, trials: int
) -> dict[str, float]:
    """The reference on this process's clock, as the candidate is timed: L2 flushed, the call between
    device synchronisations, the median empty synchronisation subtracted."""
    count = len(arg_sets)

    def call(i: int) -> None:
        model(*arg_sets[i % count])

    def before(i: int) -> None:
        flush()

    host_times(call, device, warmup, before)
    times = host_times(call, device, trials, before)
    baseline = host_times(lambda i: None, device, BASELINE_ROUNDS, before)
    return summary(times, baseline)


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)
