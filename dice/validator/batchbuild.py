"""Batched builds for training, run inside a worker (task kind ``kb_prebuild``): many candidates' extensions
compiled as few combined extensions, each candidate's later ``load_inline`` served from them.

A cold ``load_inline`` build is mostly torch's headers (:mod:`dice.validator.fastbuild`); N candidates of one
task (an RL group) parse them N times. Here:

1. **discover**: each candidate is imported with ``load_inline`` patched to record its arguments and return a
   placeholder (any attribute or call of it gives another placeholder, so module-level code such as
   ``fn = ext.forward`` runs on); nothing is built. A candidate that calls nothing at import has its
   ``ModelNew`` constructed (init inputs from its reference when given), for calls made in ``__init__``.
   A candidate whose discovery fails, that calls ``cpp_extension.load`` (files) or whose calls cannot batch
   (:func:`dice.validator.batchsource.prepare`) builds alone later, in its own task;
2. **group** the calls by flags and include lines (:mod:`dice.validator.batchsource`), skip keys already
   built, recorded as failed, or locked by a task building them now, and take each remaining key's lock
   (a KernelBench task that reaches one waits, then is served);
3. **build** each group as one extension (groups in parallel): one ``cuda.cu``, one ``main.cpp``, call ``i``
   in ``namespace dice_b<i>``, its functions in submodule ``b<i>``; the combined module is imported here (an
   undefined symbol shows now). A compile or import error is blamed on the calls its messages name; those
   leave the batch and the rest is built again; an error that names none splits the batch in halves. A call
   that fails alone is left to its own build, which gives its verdict its own error message;
4. **record** ``<cache>/torch_ext/<key>/dice_batch.json`` for every call served, with the combined ``.so``'s
   SHA-256: ``load_inline`` of that key (:func:`dice.validator.builds.cached_load_inline`) then returns a
   module holding exactly its functions from the combined ``.so`` (a cache hit, well under a second).

In the pool, step 1 runs in a runner (it imports candidates; :func:`run_prebuild`), which sends the calls
as plain data; steps 2-4 run in the builder (:mod:`dice.validator.builder`), the one process that writes
the cache, which computes every key again from the calls it got and never imports what it built: the
import check of step 3 runs in a child confined to a scratch folder (:func:`_import_check`), whose
answer can only keep calls out of a batch. :func:`prebuild` runs all four in one process (tests).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import inspect
import json
import os
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dice.validator import fastbuild
from dice.validator.batchsource import Prepared, Unit, attribute, compose, prepare
from dice.validator.builds import call_payload, extension_key, import_source
from dice.validator.paths import source_hash
from dice.validator.verdict import Verdict

if TYPE_CHECKING:
    from dice.validator.context import WorkerContext

MAX_BATCH = 32
_NOT_FLAGS = frozenset(
    ["cpp_sources", "cuda_sources", "functions", "with_pytorch_error_handling", "verbose", "build_directory"]
)
_torch_lock = threading.Lock()  # torch's load_inline (files, versioner, import) is not thread-safe


@dataclass
class Call:
    """One ``load_inline`` call recorded at discovery."""

    candidate: int
    name: str
    cpp_sources: Any
    cuda_sources: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    key: str = ""
    status: str = "alone"  # alone | cached | batched | failed
    reason: str = ""
    done_s: float = 0.0
    prepared: Prepared | None = field(default=None, repr=False)
    build_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)  # the flags, by name
    twins: list[Call] = field(default_factory=list, repr=False)  # later calls with the same key
    lock: contextlib.ExitStack | None = field(default=None, repr=False)  # its key's lock while building


def call_to_json(call: Call) -> dict[str, Any] | None:
    """A discovered call as plain data for the builder (None when its arguments are not plain data)."""
    payload = call_payload(call.name, call.cpp_sources, call.cuda_sources, call.args, call.kwargs)
    return None if payload is None else {"candidate": call.candidate, **payload}


def call_from_json(data: dict[str, Any]) -> Call:
    """A call the discovery runner sent; its key computed here from the call itself."""
    args, kwargs = tuple(data.get("args") or []), dict(data.get("kwargs") or {})
    name, cpp, cuda = str(data["name"]), data.get("cpp_sources"), data.get("cuda_sources")
    return Call(
        int(data["candidate"]), name, cpp, cuda, args, kwargs, extension_key(name, cpp, cuda, args, kwargs)
    )


class _Placeholder:
    """What ``load_inline`` returns during discovery: attributes and calls of it give more placeholders."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Placeholder()


class _FileLoad(Exception):
    pass


def run_prebuild(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    """The ``kb_prebuild`` task: the report as the verdict's message (JSON). Discovery imports the
    candidates, so it runs in a runner of its own (:mod:`dice.validator.runner`), never in this worker;
    the calls it sends are built by the builder (:mod:`dice.validator.builder`). A runner or builder that
    fails or sends anything but what was asked gives a ``runtime_error``."""
    from dice.validator.judge import ProtocolViolation, RunnerFailed, RunnerProcess, builder_args, runner_args

    ctx.phase("build")
    cand_srcs = list(task.get("cand_srcs") or [])
    args = runner_args(ctx, ctx.task_dir())
    args.update(cand_srcs=cand_srcs, ref_srcs=task.get("ref_srcs"))
    runner = builder = None
    try:
        runner = RunnerProcess(ctx.zygote, "prebuild", args)
        found = runner.receive(0, "discovered")
        runner.close()
        runner = None
        calls, problems = found.get("calls"), found.get("problems")
        if not isinstance(calls, list) or not isinstance(problems, dict):
            raise ProtocolViolation("a discovery report that is not a list of calls")
        build = builder_args(ctx, ctx.task_dir())
        build.update(calls=calls, problems=problems, candidates=len(cand_srcs))
        builder = RunnerProcess(ctx.zygote, "prebuild", build, role="builder")
        report = builder.receive(0, "prebuilt").get("report")
    except (RunnerFailed, ProtocolViolation) as exc:
        return Verdict("runtime_error", False, message=f"the batched build failed: {exc}"), False
    finally:
        for process in (runner, builder):
            if process is not None:
                process.close()
    if not isinstance(report, dict):
        return Verdict("runtime_error", False, message="the batched build sent no report"), False
    return Verdict("compiled", True, message=json.dumps(report)), False


def discover_all(
    workdir: Path, cand_srcs: list[str], ref_srcs: list[str | None] | None = None
) -> tuple[list[Call], dict[int, str]]:
    """Step 1 for every candidate: the calls, and why a candidate has none to batch."""
    calls: list[Call] = []
    problems: dict[int, str] = {}
    refs = list(ref_srcs or []) + [None] * len(cand_srcs)
    for i, src in enumerate(cand_srcs):
        found = discover(src, workdir, i, refs[i])
        if isinstance(found, str):
            problems[i] = found
        elif not found:
            problems[i] = "no load_inline call at import"
        calls += [] if isinstance(found, str) else found
    return calls, problems


def prebuild(
    cache_root: Path,
    workdir: Path,
    cand_srcs: list[str],
    *,
    ref_srcs: list[str | None] | None = None,
    max_batch: int = MAX_BATCH,
) -> dict[str, Any]:
    """Discover, group, build and record (the module's steps 1-4) in this process; the report of
    :func:`build_discovered`."""
    started = time.perf_counter()
    calls, problems = discover_all(workdir, cand_srcs, ref_srcs)
    return build_discovered(cache_root, calls, problems, len(cand_srcs), max_batch=max_batch, started=started)


def build_discovered(
    cache_root: Path,
    calls: list[Call],
    problems: dict[int, str],
    candidates: int,
    *,
    max_batch: int = MAX_BATCH,
    started: float | None = None,
) -> dict[str, Any]:
    """Steps 2-4. The report: per candidate its status (``batched`` / ``cached`` / ``alone`` /
    ``failed``), why, and the seconds until its extension was ready; the combined builds."""
    started = time.perf_counter() if started is None else started
    report: dict[str, Any] = {"candidates": [], "builds": []}
    todo = _claim(calls, cache_root)
    try:
        groups: dict[str, list[Call]] = {}
        for call in todo:
            groups.setdefault(call.prepared.group, []).append(call)  # type: ignore[union-attr]
        parts = [g[k : k + max_batch] for g in groups.values() for k in range(0, len(g), max_batch)]
        jobs = max(1, min(len(parts), int(os.environ.get("DICE_PREBUILD_JOBS", "0") or 0) or _jobs()))
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for builds in pool.map(lambda part: _build_group(part, cache_root, started), parts):
                report["builds"] += builds
    finally:
        for call in todo:
            if call.lock is not None:
                call.lock.close()
    for i in range(candidates):
        report["candidates"].append(
            _candidate_report(i, [c for c in calls if c.candidate == i], problems.get(i))
        )
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


def _jobs() -> int:
    return max(1, (os.cpu_count() or 2) // 4)


def discover(src: str, workdir: Path, index: int, ref_src: str | None = None) -> list[Call] | str:
    """The ``load_inline`` calls a candidate makes at import, or else while ``ModelNew`` is constructed
    (:func:`_construct`), none of them built; or why that failed."""
    import torch.utils.cpp_extension as cpp_extension

    calls: list[Call] = []

    def record(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        cpp, cuda = copy.deepcopy(cpp_sources), copy.deepcopy(cuda_sources)
        key = extension_key(name, cpp, cuda, args, kwargs)
        calls.append(Call(index, name, cpp, cuda, args, dict(kwargs), key))
        return _Placeholder()

    def file_load(*args: Any, **kwargs: Any) -> Any:
        raise _FileLoad("it builds files with torch.utils.cpp_extension.load")

    saved = cpp_extension.load_inline, cpp_extension.load
    names = [f"dice_discover_{source_hash(src, length=12)}_{index}", f"dice_discover_ref_{index}"]
    cpp_extension.load_inline, cpp_extension.load = record, file_load
    stage = "importing it"
    try:
        module = import_source(src, workdir / f"discover{index}.py", names[0])
        if not calls and hasattr(module, "ModelNew"):  # it may build in __init__
            stage = "constructing ModelNew"
            _construct(module, ref_src, workdir / f"discover_ref{index}.py", names[1])
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure: the candidate builds alone
        if not calls:
            return f"discovery failed {stage}: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        cpp_extension.load_inline, cpp_extension.load = saved
        for name in names:
            sys.modules.pop(name, None)
    return calls


def _construct(module: Any, ref_src: str | None, ref_path: Path, ref_name: str) -> None:
    """``ModelNew`` built on the CPU after ``torch.manual_seed(42)`` with the reference's init inputs (else
    the candidate's own ``get_init_inputs``, else none), for the ``load_inline`` calls its ``__init__``
    makes; the model is dropped."""
    import torch

    init = getattr(module, "get_init_inputs", None)
    if ref_src:
        init = import_source(ref_src, ref_path, ref_name).get_init_inputs
    torch.manual_seed(42)
    args = list(init()) if callable(init) else []
    with torch.no_grad():
        module.ModelNew(*args)


def unit_of(call: Call) -> Unit | str:
    """The call as a batch unit (its flags by name go to ``call.build_kwargs``), or why it cannot be one."""
    import torch.utils.cpp_extension as cpp_extension

    try:
        bound = inspect.signature(cpp_extension.load_inline).bind(
            call.name, call.cpp_sources, call.cuda_sources, *call.args, **call.kwargs
        )
    except TypeError as exc:
        return f"arguments do not fit load_inline: {exc}"
    args = dict(bound.arguments)
    for flag, value in (("is_python_module", True), ("no_implicit_headers", False), ("use_pch", False)):
        if flag in args and args[flag] != value:
            return f"{flag}={args[flag]!r}"
    if args.get("sycl_sources") or args.get("with_sycl"):
        return "SYCL"
    functions = args.get("functions")
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, list):
        functions = {f: f for f in functions}
    if functions is not None and (
        not isinstance(functions, dict) or not all(isinstance(k, str) for k in functions)
    ):
        return f"functions={functions!r}"
    flags = _normalized(
        {k: v for k, v in args.items() if k not in _NOT_FLAGS and k != "name"}, call.cuda_sources
    )
    call.build_kwargs = flags
    return Unit(
        key=call.key,
        name=call.name,
        cpp="\n".join(_as_list(call.cpp_sources)),
        cuda="\n".join(_as_list(call.cuda_sources)) if call.cuda_sources else None,
        functions=None if functions is None else {k: str(v) for k, v in functions.items()},
        error_handling=bool(args.get("with_pytorch_error_handling", True)),
        flags=json.dumps(sorted((k, repr(v)) for k, v in flags.items() if k != "extra_cflags")),
        cflags=json.dumps(flags.get("extra_cflags", [])),
    )


def _normalized(flags: dict[str, Any], cuda_sources: Any) -> dict[str, Any]:
    """The flags as torch uses them, so that calls whose builds run the same commands share a batch: a
    missing, None or empty list and blank entries are the same (torch strips and joins them), and
    ``-lcudart`` is what torch links a CUDA extension with anyway (the order of ``-L`` does not matter)."""
    out = dict(flags)
    for name in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths"):
        value = out.pop(name, None)
        if isinstance(value, str):
            value = [value]
        if value is not None and not isinstance(value, (list, tuple)):
            out[name] = value  # unusual: kept as given
            continue
        items = [str(v).strip() for v in value or [] if str(v).strip()]
        if name == "extra_ldflags" and cuda_sources:
            items = [v for v in items if v != "-lcudart"]
        if items:
            out[name] = items
    for name, default in (("with_cuda", None), ("keep_intermediates", True), ("use_pch", False)):
        if name in out and out[name] == default:
            del out[name]
    return out


def _claim(calls: list[Call], cache_root: Path) -> list[Call]:
    """The calls to build now, each holding its key's lock; the others get their status and reason."""
    todo: list[Call] = []
    claimed: dict[str, Call] = {}
    for call in calls:
        if call.key in claimed:  # the same extension twice: built once, both served
            claimed[call.key].twins.append(call)
            continue
        unit = unit_of(call)
        prepared = prepare(unit) if isinstance(unit, Unit) else unit
        if isinstance(prepared, str):
            call.reason = prepared
            continue
        build_dir = cache_root / "torch_ext" / call.key
        lock = contextlib.ExitStack()
        if not lock.enter_context(fastbuild.key_lock(build_dir, blocking=False)):
            lock.close()
            call.reason = "another task is building it now"
            continue
        if (build_dir / fastbuild.MANIFEST_FILE).is_file() or fastbuild.load_from_batch_record(build_dir):
            call.status, call.reason = "cached", "already built"
        elif fastbuild.recorded_failure(build_dir) is not None:
            call.status, call.reason = "failed", "a compile error is recorded for it"
        else:
            call.prepared, call.lock = prepared, lock
            claimed[call.key] = call
            todo.append(call)
            continue
        lock.close()
    return todo


def _build_group(part: list[Call], cache_root: Path, started: float) -> list[dict[str, Any]]:
    """Build one group, blaming and splitting until every call is served or failed alone; the builds'
    summaries."""
    builds: list[dict[str, Any]] = []
    pending = [part]
    while pending:
        calls = pending.pop(0)
        if len(calls) == 1:  # a combined build of one call is its own build: its task makes that
            _served(
                calls[0], "alone", "no other call to batch it with", round(time.perf_counter() - started, 3)
            )
            continue
        ok, blamed, summary = _build_combined(calls, cache_root)
        builds.append(summary)
        now = round(time.perf_counter() - started, 3)
        if ok:
            for call in calls:
                _served(call, "batched", f"combined build of {len(calls)}", now)
            continue
        if blamed:
            for i in sorted(blamed):
                _served(calls[i], "failed", "blamed by a combined build's errors: left to its own build", now)
            rest = [c for i, c in enumerate(calls) if i not in blamed]
            if rest:
                pending.append(rest)
        else:
            half = len(calls) // 2
            pending += [calls[:half], calls[half:]]
    return builds


def _served(call: Call, status: str, reason: str, now: float) -> None:
    """Set the outcome and let the tasks waiting for this key go on."""
    for c in [call, *call.twins]:
        c.status, c.reason, c.done_s = status, reason, now
    if call.lock is not None:
        call.lock.close()
        call.lock = None


def _build_combined(calls: list[Call], cache_root: Path) -> tuple[bool, set[int], dict[str, Any]]:
    """(served, calls blamed, summary) of one combined build; records the served calls."""
    import torch

    items = [c.prepared for c in calls if c.prepared is not None]
    cflags = list(dict.fromkeys(p.unit.cflags for p in items))  # one binding TU per extra_cflags
    mains, cuda = compose(items, [cflags.index(p.unit.cflags) for p in items])
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    bkey = source_hash(
        *mains, cuda, *cflags, items[0].unit.flags, torch.__version__, torch.version.cuda, arch
    )
    name = f"dice_batch_{bkey[:16]}"
    build_dir = cache_root / "torch_ext" / f"batch_{bkey}"
    info: dict[str, Any] = {"no_retry": True}
    summary: dict[str, Any] = {"calls": len(calls), "binding_tus": len(mains), "module": name, "ok": False}
    start = time.perf_counter()
    base = {k: v for k, v in calls[0].build_kwargs.items() if k != "extra_cflags"}
    base.update(functions=None, build_directory=str(build_dir), verbose=False)
    parts = [(text, dict(base, extra_cflags=json.loads(c))) for text, c in zip(mains, cflags, strict=True)]
    try:
        with fastbuild.key_lock(build_dir):
            bound = _build_and_check(name, parts, cuda, cache_root, info)
    except Exception as exc:  # noqa: BLE001 - a compile, link or import error of the combined build
        text = f"{exc}\n{traceback.format_exc()}"
        blamed = attribute(text, len(calls)) or set()
        summary.update(seconds=round(time.perf_counter() - start, 3), blamed=sorted(blamed), steps=info)
        summary["error"] = str(exc)[:400]
        return False, blamed, summary
    missing = {i for i, c in enumerate(calls) if not _has_functions(bound, i, c)}
    if missing:
        summary.update(seconds=round(time.perf_counter() - start, 3), blamed=sorted(missing))
        return False, missing, summary
    so = build_dir / f"{name}.so"
    digest = fastbuild.file_sha256(so)
    for i, item in enumerate(items):
        functions = None if item.unit.functions is None else list(item.unit.functions)
        rec = {"so": str(so), "module": name, "sub": f"b{i}", "functions": functions, "sha256": digest}
        target = cache_root / "torch_ext" / item.unit.key
        target.mkdir(parents=True, exist_ok=True)
        (target / fastbuild.BATCH_FILE).write_text(json.dumps(rec))
    summary.update(ok=True, seconds=round(time.perf_counter() - start, 3), steps=info)
    return True, set(), summary


def _build_and_check(
    name: str,
    parts: list[tuple[str, dict[str, Any]]],
    cuda: str | None,
    cache_root: Path,
    info: dict[str, Any],
) -> dict[str, list[str]]:
    """Build the combined extension and say what each submodule binds (:func:`_import_check`): torch
    writes the sources and ``build.ninja`` (for each further binding TU, in a folder of its own, to get
    its flags; one thread at a time); :func:`fastbuild.direct_build` compiles (groups in parallel)."""
    import torch.utils.cpp_extension as cpp_extension

    build_dir = Path(parts[0][1]["build_directory"])
    so = build_dir / f"{name}.so"
    if not so.is_file():
        extra: list[tuple[str, str, str]] = []
        with _torch_lock:
            original = cpp_extension.load_inline
            cudas = [cuda] if cuda else None
            fastbuild.write_build_files(original, name, [parts[0][0]], cudas, parts[0][1])
            for k, (text, kwargs) in enumerate(parts[1:], 1):
                folder = build_dir / f"part{k}"
                fastbuild.write_build_files(
                    original, name, [text], cudas, dict(kwargs, build_directory=str(folder))
                )
                ninja = fastbuild.parse_ninja((folder / "build.ninja").read_text())
                if ninja is None:
                    raise RuntimeError("the combined build needs ninja")
                src = build_dir / f"main_{k}.cpp"
                src.write_text((folder / "main.cpp").read_text())
                extra.append((f"main_{k}.o", str(src), ninja[0].get("cflags", "")))
        if not fastbuild.direct_build(
            build_dir, f"Error building extension '{name}'", cache_root, info, extra
        ):
            raise RuntimeError("the combined build needs ninja")  # not batched: the calls build alone
    with _torch_lock:
        return _import_check(name, so, build_dir / "import_check")


def _import_check(name: str, so: Path, scratch: Path, timeout: float = 120.0) -> dict[str, list[str]]:
    """What each submodule ``b<i>`` of the combined ``.so`` binds, found by importing it in a forked child
    that can write only ``scratch`` (Landlock where the kernel has it): its static initialisers are
    candidate code, which must never run in the process that writes the cache. The answer can only keep
    calls out of a batch (a call served from the batch whose functions are missing builds alone). An
    import error is raised here with the child's message, for :func:`attribute` to blame.

    Why a fork rather than a new interpreter: the builder already has torch imported (a new one costs seconds
    per combined build); the caller holds ``_torch_lock``, and the child only imports and exits."""
    import select
    import signal

    from dice.validator import sandbox

    scratch.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: confine, import, report, exit
        code = 1
        try:
            os.close(read_end)
            os.setpgid(0, 0)
            if sandbox.landlock_abi() > 0:
                sandbox.apply_landlock([scratch])
            try:
                module = fastbuild.import_extension(name, so)
                subs = {
                    k: sorted(n for n in vars(v) if not n.startswith("__"))
                    for k, v in vars(module).items()
                    if k.startswith("b") and isinstance(v, types.ModuleType)
                }
                answer: dict[str, Any] = {"ok": True, "subs": subs}
            except BaseException as exc:  # noqa: BLE001 - the combined build's import error, reported
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:20000]}
            os.write(write_end, json.dumps(answer).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while (
            time.monotonic() < deadline
            and select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))[0]
        ):
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    try:
        answer = json.loads(data)
    except ValueError:
        raise ImportError(f"importing the combined extension {name} gave no answer") from None
    if not answer.get("ok"):
        raise ImportError(str(answer.get("error")))
    subs = answer.get("subs")
    return {str(k): [str(n) for n in v] for k, v in subs.items()} if isinstance(subs, dict) else {}


def _has_functions(bound: dict[str, list[str]], index: int, call: Call) -> bool:
    names = bound.get(f"b{index}")
    functions = call.prepared.unit.functions if call.prepared is not None else None
    return names is not None and all(f in names for f in functions or {})


def _candidate_report(index: int, calls: list[Call], problem: str | None) -> dict[str, Any]:
    if problem is not None or not calls:
        return {"index": index, "status": "alone", "reason": problem or "no load_inline call", "seconds": 0.0}
    order = ["failed", "alone", "batched", "cached"]
    status = min((c.status for c in calls), key=order.index)
    reasons = sorted({c.reason for c in calls if c.status == status and c.reason})
    return {
        "index": index,
        "status": status,
        "reason": "; ".join(reasons),
        "seconds": max(c.done_s for c in calls),
        "keys": [c.key for c in calls],
    }


def _as_list(x: Any) -> list[str]:
    return [str(s) for s in x] if isinstance(x, (list, tuple)) else [str(x)]
