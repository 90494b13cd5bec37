"""The KernelBench run with the judge apart from the candidate: this process never imports a candidate.
(The ``.cu`` spec run, :mod:`dice.validator.cu`, uses the same channel, buffers and timing with its own
runner, :mod:`dice.validator.cu_runner`.)

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
- **Timing from outside**, round by round (:func:`time_rounds`): a fresh input set each round, drawn from
  a seed nothing in the candidate can know (:class:`Draws`; a few rotated only when drawing is too slow, and
  the log says so), so remembering outputs by their inputs gains nothing. The reference runs on the judge's
  copy between device synchronisations; then the judge poisons the slots, flushes L2, synchronises, sends
  ``run`` and stops its clock at ``done`` (the runner copies its outputs into the slots and synchronises
  first). The round trip of ``noop`` (the same copy and synchronisation, no forward) is the baseline
  subtracted, as an empty synchronisation is from the reference's. After each round the judge checks the
  slots against the reference's output: a runner that says ``done`` before its work finished reads back
  poison and is rejected (``outputs_not_ready``), so finishing early gains nothing.
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
from dice.validator.verdict import FLAG_SANDBOX_DENIED, Verdict

if TYPE_CHECKING:
    from dice.validator.context import WorkerContext

MAX_REPLY = 32 << 20
REPLY_TIMEOUT_S = 3600.0  # the pool's phase deadlines end a hung task first (they kill this worker)


class ProtocolViolation(Exception):
    """The runner's reply was not the one asked for."""


class RunnerFailed(Exception):
    """The runner reported an error or died: ``status`` (runtime_error | compile_error), message, log."""

    def __init__(
        self,
        status: str,
        message: str,
        log: str = "",
        records: list[Any] | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.log, self.records = status, message, log, records or []
        self.flags = flags


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
                _runner_flags(reply.get("flags")),
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


def _by_value(x: Any) -> dict[str, Any]:
    """An input sent by value: ``{"value": x}`` when it is plain JSON, else ``{"pickle": base64}``."""
    import pickle

    if isinstance(x, (int, float, bool, str, type(None))) and not (isinstance(x, float) and x != x):
        return {"value": x}
    return {"pickle": base64.b64encode(pickle.dumps(x)).decode()}


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
        self.started = ""  # how the runner's start went, for the log
        self.in_buffers: Any = None
        self.out_buffers: Any = None
        self._in_layout: Any = None
        self._values: Any = None
        self._out_layout: Any = None

    def put_inputs(self, inputs: list[Any]) -> list[Any]:
        """Write ``inputs`` into the shared buffers (new buffers when the tensors' layout changed); the
        judge's views of them, in argument order (other values as they are). Tensors on this session's
        device are shared; anything else (plain values, NumPy scalars, a CPU tensor in a GPU run) is sent
        by value: as JSON where it is plain, else pickled (judge to runner only: the runner trusts the judge,
        never the reverse), and sent again only when it changed."""
        from dice.validator.shared_tensors import SharedBuffers

        shared = [self._shared(x) for x in inputs]
        layout = [
            (str(x.dtype), tuple(x.shape), x.stride(), x.storage_offset(), x.untyped_storage().nbytes())
            for x, s in zip(inputs, shared, strict=True)
            if s
        ] + [i for i, s in enumerate(shared) if s]
        values = [_by_value(x) for x, s in zip(inputs, shared, strict=True) if not s]
        if layout != self._in_layout:
            if self.in_buffers is not None:
                self.in_buffers.close()
            self.in_buffers = SharedBuffers(
                [x for x, s in zip(inputs, shared, strict=True) if s], self.device
            )
            described, sent = iter(self.in_buffers.descriptors()), iter(values)
            specs = [{"tensor": True, **next(described)} if s else next(sent) for s in shared]
            self.runner.request("inputs", "ok", fds=self.in_buffers.fds, inputs=specs)
            self._in_layout, self._values = layout, values
        elif values != self._values:
            self.runner.request("values", "ok", values=values)
            self._values = values
        buffers = iter(self.in_buffers.tensors)
        views = []
        for x, s in zip(inputs, shared, strict=True):
            if s:
                view = next(buffers)
                view.copy_(x)
                views.append(view)
            else:
                views.append(x)
        return views

    def _shared(self, x: Any) -> bool:
        import torch

        return isinstance(x, torch.Tensor) and x.device.type == self.device.type

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
        exc.status,
        exc.status != "compile_error",
        message=exc.message,
        log=(log + "\n" + exc.log).strip(),
        flags=list(exc.flags),
    )


def _runner_flags(value: Any) -> tuple[str, ...]:
    """The flags a runner's error reply may carry: only ``sandbox_denied``, and only on a failure (it comes
    from the candidate's process, so it may say nothing that could make a verdict better)."""
    return (FLAG_SANDBOX_DENIED,) if isinstance(value, list) and FLAG_SANDBOX_DENIED in value else ()


def runner_rejection(claim: Any) -> Verdict:
    """The verdict of a guard the runner saw fire (``{"guard", "reason"}``); anything else it sends there is
    a protocol violation."""
    from dice.validator.runtime_guards import RUNTIME_GUARDS

    names = {g.name for g in RUNTIME_GUARDS}
    if not isinstance(claim, dict) or claim.get("guard") not in names:
        raise ProtocolViolation("a rejection naming no guard")
    return rejected(str(claim["guard"]), str(claim.get("reason", ""))[:500])


BASELINE_ROUNDS = 20
PILOT_TRIALS = 10  # timed rounds before a build's early stop may end timing (time_rounds' stop_below)
DRAW_BUDGET_S = 20.0  # fresh input sets for every timing round while drawing them all takes at most this
MAX_KEPT_SETS = 3  # above it: this many sets, rotated (a set takes too long to draw for every round)


class Draws:
    """The input sets of the timing rounds: a fresh one every round, from a seed nothing in the candidate
    can know (:func:`random_seeds`), so a candidate that remembers outputs by their inputs' content gains
    nothing; or, when one set takes so long to draw that every round's would exceed :data:`DRAW_BUDGET_S`,
    a few rotated (the log says so: repeats could then be remembered). ``draw(seed)`` makes a set."""

    def __init__(self, draw: Callable[[int], list[Any]], rounds: int, max_kept: int = MAX_KEPT_SETS) -> None:
        self._draw = draw
        self.seeds = random_seeds(rounds)
        started = time.perf_counter()
        first = draw(self.seeds[0])
        took = time.perf_counter() - started
        self._first: list[Any] | None = first
        self._kept: list[list[Any]] = []
        if took * rounds <= DRAW_BUDGET_S:
            self.describe = f"a fresh input set every round ({rounds}, seeds drawn at random)"
            return
        count = max(1, min(max_kept, int(DRAW_BUDGET_S / max(took, 1e-9)), rounds))
        self._kept = [first] + [draw(s) for s in self.seeds[1:count]]
        self._first = None
        self.describe = (
            f"{count} input set(s) rotated over {rounds} rounds (drawing one takes {took:.2f} s, too long "
            "for a fresh one every round): a candidate remembering outputs by content could gain in repeats"
        )

    def __call__(self, i: int) -> list[Any]:
        if self._kept:
            return self._kept[i % len(self._kept)]
        if i == 0 and self._first is not None:
            first, self._first = self._first, None
            return first
        return self._draw(self.seeds[i])

    def seed(self, i: int) -> int:
        """The seed round ``i``'s set was drawn from."""
        return self.seeds[i % len(self._kept)] if self._kept else self.seeds[i]

    def close(self) -> None:
        self._kept, self._first = [], None


class Mismatch:
    """A timing round whose outputs were wrong: ``round`` (1-based), ``seed``, the comparison's message;
    ``unwritten``: the slots still held poison (NaN where the reference has none) when "done" came."""

    def __init__(self, round_number: int, seed: int, message: str, unwritten: bool) -> None:
        self.round, self.seed, self.message, self.unwritten = round_number, seed, message, unwritten


def unwritten(slots: list[Any], want: Any) -> bool:
    """Whether a floating slot holds more NaN than the reference's output: poison :func:`poison` wrote that
    the runner did not overwrite."""
    import torch

    for slot, ref in zip(slots, tensors(want), strict=False):
        floating = slot.is_floating_point() and ref.shape == slot.shape
        if floating and int(torch.isnan(slot).sum()) > int(torch.isnan(ref).sum()):
            return True
    return False


def time_rounds(
    session: Session,
    reference: Callable[..., Any],
    draws: Draws,
    flush: Any,
    tolerance: tuple[float, float],
    *,
    warmup: int,
    trials: int,
    stop_below: float | None = None,
    pilot: int = PILOT_TRIALS,
) -> tuple[dict[str, float], dict[str, float]] | Mismatch:
    """The reference and the candidate timed round by round on this process's clock, on the same input set
    (:class:`Draws`), L2 flushed before each: the reference here between device synchronisations, the
    candidate from "go" (``run``) to "done", its outputs checked against the reference's after each (a
    runner that says done before its work finished reads back poison). Minus the median empty
    synchronisation (reference) and the median ``noop`` round trip (candidate). ``(reference, candidate)``
    summaries (each with ``trials``, the rounds timed), or the first round whose outputs were wrong.

    ``stop_below`` (a dataset build's cut-off, e.g. half its threshold): after ``pilot`` timed rounds, a
    candidate whose speedup so far (baselines measured then) is below it stops there, its summaries marked
    ``stopped_early``. A build that keeps only kernels at 2x needs no 100-round mean of one at 0.3x, and the
    GPU is the validator's one serial resource (benchmarks/results/cuke_h100.md: timing took 212 of 370 s)."""
    from dice.validator.gpu import compare_outputs, flatten

    device = session.device
    ref_times: list[float] = []
    new_times: list[float] = []
    slots: list[Any] = []
    check_at = warmup + pilot if stop_below is not None and 0 < pilot < trials else None
    for i in range(warmup + trials):
        if i == check_at:
            ref_s = summary(ref_times, _sync_baseline(device, flush))
            new_s = summary(new_times, _noop_baseline(session, slots, flush))
            if ref_s["mean_ms"] / new_s["mean_ms"] < stop_below:
                return _marked(ref_s, len(ref_times), True), _marked(new_s, len(new_times), True)
        args = draws(i)
        session.put_inputs(args)  # before the reference, which may change its inputs in place
        flush()
        sync(device)
        t0 = time.perf_counter()
        want = reference(*args)
        sync(device)
        ref_ms = (time.perf_counter() - t0) * 1e3
        slots = session.slots_like(want)
        poison(slots)
        flush()
        sync(device)
        t0 = time.perf_counter()
        session.runner.request("run", "done")
        new_ms = (time.perf_counter() - t0) * 1e3
        got = rebuild(want, slots, [x for x in flatten(want) if not _is_tensor(x)])
        cmp = compare_outputs(got, want, atol=tolerance[0], rtol=tolerance[1])
        if not cmp.correct:
            return Mismatch(i + 1, draws.seed(i), cmp.message, unwritten(slots, want))
        if i >= warmup:
            ref_times.append(ref_ms)
            new_times.append(new_ms)
        del args, want, got  # before the next set is drawn: multi-GB problems hold one at a time
    ref_s = summary(ref_times, _sync_baseline(device, flush))
    new_s = summary(new_times, _noop_baseline(session, slots, flush))
    return _marked(ref_s, len(ref_times), False), _marked(new_s, len(new_times), False)


def _marked(s: dict[str, float], trials: int, stopped: bool) -> dict[str, Any]:
    return {**s, "trials": trials, "stopped_early": stopped}


def _sync_baseline(device: Any, flush: Any) -> list[float]:
    """Empty synchronisations, L2 flushed before each: what the reference's clock adds to every round."""
    return host_times(lambda i: None, device, BASELINE_ROUNDS, lambda i: flush())


def _noop_baseline(session: Session, slots: list[Any], flush: Any) -> list[float]:
    """Empty ``noop`` round trips: what the candidate's go/done clock adds to every round."""
    base = []
    for _ in range(BASELINE_ROUNDS):
        poison(slots)
        flush()
        sync(session.device)
        t0 = time.perf_counter()
        session.runner.request("noop", "done")
        base.append((time.perf_counter() - t0) * 1e3)
    return base


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)
