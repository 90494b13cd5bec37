"""The editor's ``.cu`` infill tasks: one masked hole per task, from real CUDA files and validated kernels.

A task is a whole file with exactly one hole replaced by the mask comment of docs/CONTRACTS.md
(``/* <MASK> */``) and the hole's original text as the target, so a reward can splice a fill back and compile
(and, with a dice-spec and a GPU, run) it. Holes are cut only where a compiler checks a fill: bodies of
non-template ``__global__``/``__device__`` functions (a template nothing instantiates is never type-checked,
host code never reaches NVRTC). A file's holes are kept only when its *unmodified* device code compiles,
else every fill would score as a compile error whatever the model wrote: standalone first, else (when the
caller found the file's project headers, :mod:`training.cuke.headers`) with the folder the file would sit in
and its project's include roots on the NVRTC include path. Such a task carries that ``folder`` and those
``include_paths`` (relative to the build's output folder), so a fill is compiled with exactly the headers its
original compiled with; a standalone task carries neither.

Kinds: ``statement``, ``statements`` (a run of 2-4), ``loop_body``, ``kernel_body`` (the cuts of
:func:`training.corpus.cuts.infill_cuts`, the ones the SFT corpus trains on) and ``expression`` (the
right-hand side of an initialisation or assignment, an index, a condition, a return value: the tree-sitter
node, one line, never a bare name or number, which any in-scope word would fill).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from training.corpus.cuts import InfillCut, infill_cuts
from training.cuke.headers import CompileContext
from training.cuke.records import CuFile, content_hash

MASK = "/* <MASK> */"
# Round-robin order of a file's holes: the editor's main use (one statement, one expression) first.
KIND_ORDER = ("statement", "expression", "kernel_body", "statements", "loop_body")
CU_KINDS = frozenset(KIND_ORDER)
# The engine's hole shape (engine.shape) each kind is decoded and cut with; the others: no shape.
CU_SHAPES = {"statement": "statement", "expression": "expression"}
DEFAULT_PER_FILE = 8
MAX_TARGET_CHARS = 1600  # as the SFT corpus's .cu holes (CorpusConfig.max_middle_chars)
MAX_EXPRESSION_CHARS = 160
# Leaves a hole would make trivial: any in-scope word or digit compiles.
_TRIVIAL_EXPRESSIONS = frozenset(
    {"identifier", "field_identifier", "number_literal", "true", "false", "null", "nullptr", "char_literal"}
)
# Expressions whose fill would not end where the engine's "expression" shape ends (engine.shape).
_UNFIT_EXPRESSIONS = frozenset(
    {"comma_expression", "initializer_list", "argument_list", "lambda_expression", "declaration"}
)


class CuSource(NamedTuple):
    """A CUDA text to cut tasks from: ``id`` becomes the tasks' ``origin``; ``has_spec`` whether a dice-spec
    gives it a reference (so a reward can run it, not only compile it)."""

    id: str
    text: str
    has_spec: bool


@dataclass
class CuTaskStats:
    """What :func:`cu_infill_tasks` saw, for the build's funnel report (counts per stage, compile time)."""

    files: int = 0
    with_holes: int = 0  # had at least one hole in a checked device function
    compiled: int = 0  # ... and its unmodified device code compiled (alone or with its headers)
    compiled_standalone: int = 0
    headers_tried: int = 0  # failed alone, and its project headers were found: compiled again with them
    compiled_with_headers: int = 0
    dropped_after_prune: int = 0  # compiled with headers, not in the final tree (training.cuke.build)
    tasks: int = 0
    by_kind: Counter = field(default_factory=Counter)
    compile_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "with_holes": self.with_holes,
            "compiled": self.compiled,
            "compiled_standalone": self.compiled_standalone,
            "headers_tried": self.headers_tried,
            "compiled_with_headers": self.compiled_with_headers,
            "dropped_after_prune": self.dropped_after_prune,
            "compile_failed": self.with_holes - self.compiled,
            "tasks": self.tasks,
            "by_kind": dict(sorted(self.by_kind.items())),
            "compile_seconds": round(self.compile_seconds, 3),
        }


def nvrtc_compiles(text: str, include_dirs: Sequence[str] = (), *, timeout_s: float | None = None) -> bool:
    """Whether the device code of ``text`` compiles under NVRTC, as the ``.cu`` validator's first check
    compiles it (``cu_compile.run_compile_checks``): the extracted device code, the template kernels the
    host code launches instantiated (alone: torch headers given empty stand-ins). ``include_dirs``:
    absolute folders for ``-I``, the file's own folder first, as the validator orders a file's folder and
    its include paths (:meth:`training.cuke.headers.CompileContext.include_dirs`); none: the file alone,
    with no folder and no compile command. Plain strings, so the check pickles into the build's worker
    processes. The compile runs in the validator's NVRTC child process, killed at ``timeout_s`` (default the
    validator's), its address space capped, so a pathological file costs a timeout, not the build. False
    also when there is no kernel or device function to compile."""
    from dice.cuda_source import extract_device_code, parse_document
    from dice.validator.build_flags import BuildOptions
    from dice.validator.compile import TORCH_HEADER_PREFIXES, nvrtc_compile
    from dice.validator.cu_compile import CuFile as ValidatorFile
    from dice.validator.cu_compile import build_flags_for
    from dice.validator.limits import NVRTC_TIMEOUT_S
    from dice.validator.unchecked import launch_name_expressions

    doc = parse_document(text)
    if not any(f.kind in ("global", "device") for f in doc.functions):
        return False
    # As the validator extracts it: no `project_headers`, so a `<...>` include of a project header in the
    # file itself is dropped there too (quoted ones stay; headers on disk are read as they are).
    device = extract_device_code(text)
    # No folder: the flags come from the options alone, never from a compile_commands.json that happens to
    # sit above the tree (the reward passes its own, empty, database for the same reason).
    build = BuildOptions(include_paths=tuple(include_dirs)) if include_dirs else None
    flags = build_flags_for(ValidatorFile(text, "kernel.cu", None, build))
    result = nvrtc_compile(
        device.source,
        arch=flags.arch_for(None),
        line_map=device.line_map,
        options=flags.nvrtc_options(),
        # Alone, the file's own torch includes are host code the extraction drops anyway. With headers, the
        # headers on disk are compiled as they are, and the reward's NVRTC gives a torch include in one no
        # stand-in: neither may this check, or a file kept here would fail there.
        stub_header_prefixes=() if include_dirs else TORCH_HEADER_PREFIXES,
        name_expressions=launch_name_expressions(doc),
        timeout_s=NVRTC_TIMEOUT_S if timeout_s is None else timeout_s,
    )
    return bool(result.ok and not result.timed_out)


def cu_infill_tasks(
    files: Iterable[CuFile | CuSource | tuple[str, str, bool]],
    *,
    per_file: int = DEFAULT_PER_FILE,
    seed: int = 0,
    compile_check: Callable[..., bool] = nvrtc_compiles,
    max_target_chars: int = MAX_TARGET_CHARS,
    workers: int = 1,
    stats: CuTaskStats | None = None,
    headers: Mapping[str, CompileContext] | None = None,
    headers_base: str | os.PathLike[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Up to ``per_file`` one-hole tasks per file whose unmodified device code passes ``compile_check``:
    ``{id, text, target, origin, has_spec, kind}`` (plus ``folder`` and ``include_paths`` for a file that
    compiled only with its headers), ``text`` the file with the hole replaced by :data:`MASK`, so
    ``text.replace(MASK, target, 1)`` is the original.

    ``compile_check(text)`` decides for the file alone. ``headers``: the compile context of a file by its id
    (:meth:`training.cuke.headers.HeaderTree.stage`, the headers already on disk under ``headers_base``); a
    file that fails alone and has one is checked again as ``compile_check(text, include_dirs)``.

    Holes are drawn round-robin over :data:`KIND_ORDER`, at random within a kind, from a generator seeded
    by ``seed`` and the file's id: the same files give the same tasks in any order and any chunking. Files
    with no hole are not compiled. ``workers > 1`` compiles that many files at once in child processes
    (``compile_check`` must then be picklable: a module-level function such as :func:`nvrtc_compiles`);
    tasks still come out in file order. ``stats``, when given, is filled in as files go by.
    """
    if headers and headers_base is None:
        raise ValueError("headers given without headers_base (the folder their paths are relative to)")
    stats = stats if stats is not None else CuTaskStats()
    contexts = headers or {}
    base = os.fspath(headers_base) if headers_base is not None else ""
    chunk = max(1, workers) * 4
    pending: list[tuple[CuSource, list[InfillCut]]] = []
    pool = process_pool(workers) if workers > 1 else None
    try:
        for item in files:
            source = _as_source(item)
            stats.files += 1
            cuts = [c for c in hole_cuts(source.text) if c.end - c.start <= max_target_chars]
            if not cuts:
                continue
            stats.with_holes += 1
            pending.append((source, cuts))
            if len(pending) >= chunk:
                yield from _checked_tasks(pending, compile_check, pool, per_file, seed, stats, contexts, base)
                pending = []
        yield from _checked_tasks(pending, compile_check, pool, per_file, seed, stats, contexts, base)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def submit_task_file(
    pool: Any,
    text: str,
    *,
    folder: str | None = None,
    include_paths: Sequence[str] = (),
    empty_database: str | os.PathLike[str] | None = None,
    run: bool,
    spec_origin: Any = None,
) -> Any:
    """``pool.submit_cu`` of a ``.cu`` task's file (an original or a filled one) as the RL reward compiles
    it: alone, or, for a file that needs its project's headers, in ``folder`` with ``include_paths`` and the
    explicitly named ``empty_database`` (a ``compile_commands.json`` with no entries, written here when
    missing), so that no database above the folder lends its flags. One function for CuKe's check of each
    original and the reward's check of each fill: both must compile a file the same way."""
    if folder is None:
        return pool.submit_cu(text, run=run, spec_origin=spec_origin)
    from pathlib import Path

    from dice.validator.build_flags import BuildOptions

    if empty_database is None:
        raise ValueError("a file compiled in its folder needs the empty compile database's path")
    database = Path(empty_database)
    if not database.is_file():
        database.parent.mkdir(parents=True, exist_ok=True)
        database.write_text("[]\n", encoding="utf-8")
    build = BuildOptions(compile_commands=str(database), include_paths=tuple(include_paths))
    return pool.submit_cu(text, run=run, spec_origin=spec_origin, folder=folder, build=build)


def compile_all(
    jobs: Sequence[tuple[str, tuple[str, ...]]], compile_check: Callable[..., bool], pool=None
) -> list[bool]:
    """``compile_check`` of each ``(text, include_dirs)``, in order; across ``pool`` (a
    ``ProcessPoolExecutor``) when given. No include folders: the one-argument call, the file alone."""
    alone = [i for i, (_, dirs) in enumerate(jobs) if not dirs]
    with_dirs = [i for i, (_, dirs) in enumerate(jobs) if dirs]
    out = [False] * len(jobs)
    mapper = pool.map if pool is not None else map
    for i, ok in zip(alone, mapper(compile_check, [jobs[i][0] for i in alone]), strict=True):
        out[i] = bool(ok)
    texts, dirs = [jobs[i][0] for i in with_dirs], [jobs[i][1] for i in with_dirs]
    for i, ok in zip(with_dirs, mapper(compile_check, texts, dirs), strict=True):
        out[i] = bool(ok)
    return out


def process_pool(workers: int):  # -> concurrent.futures.ProcessPoolExecutor
    """Spawned, not forked: a fork would share the parent's NVRTC child process and its pipes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _checked_tasks(
    pending: list[tuple[CuSource, list[InfillCut]]],
    compile_check: Callable[..., bool],
    pool,  # ProcessPoolExecutor | None
    per_file: int,
    seed: int,
    stats: CuTaskStats,
    contexts: Mapping[str, CompileContext],
    base: str,
) -> Iterator[dict[str, Any]]:
    """The tasks of a chunk of files, compile-checked (alone, then with headers where that failed and the
    file has them) one by one or across the pool, in file order."""
    start = time.perf_counter()
    verdicts = compile_all([(source.text, ()) for source, _ in pending], compile_check, pool)
    stats.compiled_standalone += sum(verdicts)
    retry = [i for i, (source, _) in enumerate(pending) if not verdicts[i] and source.id in contexts]
    jobs = [(pending[i][0].text, contexts[pending[i][0].id].include_dirs(base)) for i in retry]
    with_headers = dict(zip(retry, compile_all(jobs, compile_check, pool), strict=True))
    stats.headers_tried += len(retry)
    stats.compiled_with_headers += sum(with_headers.values())
    stats.compile_seconds += time.perf_counter() - start
    for i, (source, cuts) in enumerate(pending):
        if not (verdicts[i] or with_headers.get(i)):
            continue
        stats.compiled += 1
        extra: dict[str, Any] = {}
        if not verdicts[i]:
            ctx = contexts[source.id]
            extra = {"folder": ctx.folder, "include_paths": list(ctx.include_paths)}
        for task in _file_tasks(source, cuts, per_file, seed):
            stats.tasks += 1
            stats.by_kind[task["kind"]] += 1
            yield task | extra


def _as_source(item: CuFile | CuSource | tuple[str, str, bool]) -> CuSource:
    """A corpus file's ``has_spec`` is whether it carries a dice-spec block; a tuple says it itself."""
    if isinstance(item, CuFile):
        from dice.cuda_source import parse_document

        return CuSource(item.id, item.text, parse_document(item.text).spec is not None)
    ident, text, has_spec = item
    return CuSource(str(ident), text, bool(has_spec))


def _file_tasks(
    source: CuSource, cuts: list[InfillCut], per_file: int, seed: int
) -> Iterator[dict[str, Any]]:
    """Up to ``per_file`` distinct holes, kinds in turn, each kept only when it reads as exactly one mask."""
    rng = random.Random(f"{seed}:{source.id}")
    by_kind: dict[str, list[InfillCut]] = {}
    for cut in sorted(set(cuts), key=lambda c: (c.start, c.end, c.kind)):
        by_kind.setdefault(cut.kind, []).append(cut)
    for pool in by_kind.values():
        rng.shuffle(pool)
    seen: set[tuple[int, int]] = set()
    made = 0
    while made < per_file and any(by_kind.values()):
        for kind in KIND_ORDER:
            pool = by_kind.get(kind)
            while pool and made < per_file:
                cut = pool.pop()
                if (cut.start, cut.end) in seen:
                    continue  # the same span under another kind (a one-statement loop body)
                seen.add((cut.start, cut.end))
                task = _task(source, cut)
                if task is not None:
                    made += 1
                    yield task
                    break


def _task(source: CuSource, cut: InfillCut) -> dict[str, Any] | None:
    text = source.text
    target = text[cut.start : cut.end]
    if not target.strip():
        return None
    masked = text[: cut.start] + MASK + text[cut.end :]
    if "<MASK" in text and not _one_mask_at(masked, cut.start):
        return None  # the file already holds mask-like comments: keep only a hole that reads as the one mask
    return {
        "id": "cu-" + content_hash(source.id, source.text, cut.kind, str(cut.start), str(cut.end))[:16],
        "text": masked,
        "target": target,
        "origin": source.id,
        "has_spec": source.has_spec,
        "kind": cut.kind,
    }


def _one_mask_at(masked: str, start: int) -> bool:
    from dice.cuda_source import parse_document

    doc = parse_document(masked)
    prefix_bytes = len(masked[:start].encode("utf-8"))
    return len(doc.masks) == 1 and doc.masks[0].start_byte == prefix_bytes and not doc.malformed_masks


def hole_cuts(text: str) -> list[InfillCut]:
    """Every hole of ``text`` a compiler would check a fill of: :func:`infill_cuts`'s statements, runs,
    loop bodies and kernel bodies plus :func:`expression_cuts`, inside the bodies of the non-template
    ``__global__``/``__device__`` functions (namespaces and struct members included). Character offsets."""
    from dice.cuda_source import parse_bytes, parse_document

    doc = parse_document(text)
    data = doc.data
    char_of = _char_offsets(text, data)
    out: list[InfillCut] = []
    for fn in doc.functions:
        if fn.kind not in ("global", "device") or fn.is_template or fn.recovered:
            continue
        snippet = data[fn.start_byte : fn.end_byte]
        base = char_of(fn.start_byte)
        # The function alone parses as a top-level definition, which is where infill_cuts looks.
        cuts = infill_cuts(snippet.decode("utf-8", "replace"))
        cuts += expression_cuts(snippet.decode("utf-8", "replace"), tree=parse_bytes(snippet))
        out += [InfillCut(c.kind, base + c.start, base + c.end) for c in cuts]
    return out


def expression_cuts(text: str, *, tree=None) -> list[InfillCut]:  # tree: tree_sitter.Tree | None
    """Expression holes of the function bodies in ``text``: the value of an initialisation or the right side
    of an assignment, a single index, an ``if``/``while``/``for`` condition, a return value. One line, at most
    :data:`MAX_EXPRESSION_CHARS`, no comment inside, never a bare name or literal."""
    from dice.cuda_source import parse_bytes

    src = text.encode("utf-8")
    tree = tree if tree is not None else parse_bytes(src)
    bodies = [
        n.child_by_field_name("body")
        for n in tree.root_node.children
        if n.type == "function_definition" and n.child_by_field_name("body") is not None
    ]
    char_of = _char_offsets(text, src)
    return [InfillCut("expression", char_of(a), char_of(b)) for a, b in expression_spans(src, bodies)]


def expression_spans(src: bytes, bodies: Iterable) -> list[tuple[int, int]]:  # bodies: tree_sitter.Node
    """Byte spans of the expression holes inside ``bodies`` (function bodies of ``src``, any function: the
    rule of :func:`expression_cuts`), sorted and distinct."""
    spans: list[tuple[int, int]] = []
    stack = list(bodies)
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        target = _expression_target(node)
        if target is None or target.has_error or target.type in _TRIVIAL_EXPRESSIONS | _UNFIT_EXPRESSIONS:
            continue
        piece = src[target.start_byte : target.end_byte]
        if b"\n" in piece or b"/*" in piece or b"//" in piece or len(piece) > MAX_EXPRESSION_CHARS:
            continue
        spans.append((target.start_byte, target.end_byte))
    return sorted(set(spans))


def _expression_target(node):  # tree_sitter.Node -> tree_sitter.Node | None
    """The expression child of ``node`` that makes a hole, if ``node`` is a place holding one."""
    if node.type == "init_declarator":
        return node.child_by_field_name("value")
    if node.type == "assignment_expression":
        return node.child_by_field_name("right")
    if node.type == "condition_clause":
        return node.child_by_field_name("value")
    if node.type == "for_statement":
        return node.child_by_field_name("condition")
    if node.type == "subscript_argument_list":
        return node.named_children[0] if len(node.named_children) == 1 else None
    if node.type == "return_statement":
        return node.named_children[0] if len(node.named_children) == 1 else None
    return None


def _char_offsets(text: str, data: bytes) -> Callable[[int], int]:
    """Byte offset -> character offset of ``text`` (``data`` its UTF-8 bytes); identity for ASCII files."""
    if len(data) == len(text):
        return lambda b: b
    table: list[int] = []
    for i, ch in enumerate(text):
        table.extend([i] * len(ch.encode("utf-8")))
    table.append(len(text))
    return lambda b: table[b]


__all__ = [
    "CU_KINDS",
    "KIND_ORDER",
    "MASK",
    "CuSource",
    "CuTaskStats",
    "compile_all",
    "cu_infill_tasks",
    "expression_cuts",
    "expression_spans",
    "hole_cuts",
    "nvrtc_compiles",
    "process_pool",
    "submit_task_file",
]
