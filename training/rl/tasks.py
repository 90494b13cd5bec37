"""BiC-RL's tasks: CuKe's task files read in file order, each with the exact text the engine is prompted with.

The order of the records is the data schedule (CuKe sorts every task file by level: single op -> fused ops ->
whole model), so :func:`load_tasks` keeps it and never sorts or deduplicates. A task's kind comes from its
record's fields, not the file's name (a renamed or held-out copy reads the same), and must fit the phase:

- ``infill`` (``infill.jsonl``, DICE's kernel-infilling schema ``{id, pytorch_code, cuda_code, prefix, middle,
  suffix, level}``): DICE's infilling prompt with the PyTorch reference as context; the response is
  pre-filled with the code fence and the prefix, so the model writes the middle (the CUDA source string's
  assignment) and the program is ``prefix + middle + suffix``. Phase ``infill``.
- ``cu_infill`` (``cu_infill.jsonl``, ``{id, text, target, origin, has_spec, kind}``, ``text`` holding one
  ``/* <MASK> */``): the engine's infilling prompt for the text around the mask (no PyTorch context, the
  shape of the hole deciding where a fill ends, as the editor asks), the program being the filled file.
  Phase ``infill`` (our extension: a reward a CPU can compute). A file that compiles only with its
  project's headers also names ``folder`` (where it would sit) and ``include_paths``, relative to the task
  file's folder (CuKe writes them under ``cu_projects/``): :attr:`Task.headers` holds them resolved, for the
  reward's compile. They never reach the prompt, which is the file's own text as for any other task.
- ``e2e`` (``e2e.jsonl``, ``{id, pytorch_code, level}``): the KernelBench one-shot prompt, variant ``"rl"``
  (the string DICE's end-to-end rollouts feed the model); the program is ``extract_program`` of the answer.
  Phase ``e2e``.
- ``toy`` (``{id, prompt}``, the prompt used as it is): smoke runs and tests with a toy reward; any phase.

Prompts are built once here, with the engine's own functions, so rollouts, rewards and training all see the
same text: a checkpoint answers best to the exact template it was trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.answers import extract_program
from engine.infill import InfillPlan
from engine.prompts import kernelbench_prompt
from training.cuke.cu_tasks import CU_SHAPES, MASK

TaskKind = Literal["infill", "cu_infill", "e2e", "toy"]
PHASE_KINDS: dict[str, tuple[str, ...]] = {
    "infill": ("infill", "cu_infill", "toy"),
    "e2e": ("e2e", "toy"),
}
# The file each kind comes from, for messages.
KIND_FILES = {"infill": "infill.jsonl", "cu_infill": "cu_infill.jsonl", "e2e": "e2e.jsonl", "toy": "toy"}
# A .cu task has no level (one hole in one file): it is scheduled as a single op (training.rl.schedule).
CU_LEVEL = 1
_REQUIRED: dict[str, dict[str, type]] = {
    "infill": {
        "id": str,
        "pytorch_code": str,
        "cuda_code": str,
        "prefix": str,
        "middle": str,
        "suffix": str,
    },
    "cu_infill": {"id": str, "text": str, "target": str},
    "e2e": {"id": str, "pytorch_code": str},
    "toy": {"id": str, "prompt": str},
}


class TaskFileError(ValueError):
    """A task file the run cannot use; the message names the file and the line."""


@dataclass(frozen=True)
class CuPrompting:
    """How a ``.cu`` task's file becomes an infilling prompt, as the assistant prompts the same model:
    ``hole_cut`` is the model's (``engine.model_settings.read_hole_cut``: "line" prompts a mask alone on its
    line as whole lines), ``window_bytes`` caps ``2 * len(prefix) + len(suffix)`` in UTF-8 bytes, the text
    around the hole trimmed as the assistant trims it (``dice.cuda_source.trim_context``: the enclosing
    function kept whole when it fits); None: the whole file (a large file then needs a large context)."""

    hole_cut: str = "byte"
    window_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.hole_cut not in ("byte", "line"):
            raise ValueError(f"hole cut must be 'byte' or 'line', got {self.hole_cut!r}")
        if self.window_bytes is not None and self.window_bytes <= 0:
            raise ValueError(f"the window must be a positive number of bytes, got {self.window_bytes}")


@dataclass(frozen=True)
class CuCut:
    """A ``.cu`` task's file around its hole: ``file_prefix + middle + file_suffix`` is the filled file;
    ``prompt_prefix`` / ``prompt_suffix`` (their tail / head) are what the prompt shows. ``line_aligned``:
    the hole is whole lines (the middle holds its indentation and its final line break)."""

    file_prefix: str
    file_suffix: str
    prompt_prefix: str
    prompt_suffix: str
    line_aligned: bool


@dataclass(frozen=True)
class CuHeaders:
    """Where a ``.cu`` task's file compiles with its project's headers: absolute ``folder`` (the folder the
    file would sit in) and ``include_paths`` (its include roots), as the build's compile check used them."""

    folder: str
    include_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    """One RL task. ``prompt`` is the exact text the engine continues (ChatML applied, any pre-filled
    response prefix included); ``record`` is the file's record as read; ``cut`` (``cu_infill`` only) the
    file around the hole and the part of it the prompt shows; ``headers`` (``cu_infill`` only, None for a
    file that compiles alone) the folders its compile needs."""

    id: str
    kind: TaskKind
    level: int
    prompt: str
    record: dict[str, Any] = field(repr=False, compare=False)
    cut: CuCut | None = field(default=None, repr=False, compare=False)
    headers: CuHeaders | None = field(default=None, repr=False, compare=False)


def kind_of(record: dict[str, Any]) -> TaskKind:
    """The kind a record's fields say (the most specific schema that has its key fields)."""
    keys = set(record)
    if keys & {"prefix", "middle", "suffix"}:
        return "infill"
    if keys & {"text", "target"}:
        return "cu_infill"
    if "pytorch_code" in keys:
        return "e2e"
    if "prompt" in keys:
        return "toy"
    raise ValueError(
        "not a task record: expected the fields of infill.jsonl (prefix, middle, suffix, cuda_code, ...), "
        "cu_infill.jsonl (text, target, ...), e2e.jsonl (pytorch_code, level) or a toy task (id, prompt)"
    )


def infill_plan(task: Task) -> InfillPlan | None:
    """The engine's infilling request of an ``infill`` / ``cu_infill`` task (None for the others): its
    ``prompt_text`` is ``task.prompt``, and it says where the middle of an answer ends."""
    return _plan(task.kind, task.record, task.cut)


def _plan(kind: str, rec: dict[str, Any], cut: CuCut | None) -> InfillPlan | None:
    if kind == "infill":
        return InfillPlan.make(rec["prefix"], rec["suffix"], context=rec["pytorch_code"])
    if kind == "cu_infill":
        assert cut is not None
        shape = CU_SHAPES.get(str(rec.get("kind")))
        return InfillPlan.make(cut.prompt_prefix, cut.prompt_suffix, context=None, shape=shape)
    return None


def cu_cut(text: str, prompting: CuPrompting = CuPrompting()) -> CuCut:
    """The file of a ``.cu`` task (``text`` holding one mask) cut around its hole as ``prompting`` says:
    the assistant's cut of the same mask (``dice.assistant.prompting.build_infill_request``)."""
    from dice.cuda_source import hole_context, line_aligned_span, parse_document
    from dice.cuda_source.positions import decode_bytes

    doc = parse_document(text)
    mask = doc.masks[0]
    data = doc.data
    span = line_aligned_span(data, mask.start_byte, mask.end_byte) if prompting.hole_cut == "line" else None
    lo, hi = span if span is not None else (mask.start_byte, mask.end_byte)
    before, after = data[:lo], data[hi:]
    file_prefix, file_suffix = decode_bytes(before), decode_bytes(after)
    if prompting.window_bytes is not None:
        fstart, fend = mask.function_start_byte, mask.function_end_byte
        function = (fstart, fend) if fstart is not None and fend is not None else None
        before, after = hole_context(data, lo, hi, function, prompting.window_bytes, 2)
    return CuCut(file_prefix, file_suffix, decode_bytes(before), decode_bytes(after), span is not None)


def file_split(task: Task) -> tuple[str, str]:
    """The text of a ``.cu`` task's file before and after its hole (the hole's whole lines for a line cut)."""
    assert task.cut is not None
    return task.cut.file_prefix, task.cut.file_suffix


def program_from(task: Task, response_text: str) -> str:
    """What gets validated for ``response_text`` (the generated text after ``task.prompt``).

    infill: ``prefix + middle + suffix``, the middle cut where the suffix starts (or the code fence ends), as
    ``Engine.infill`` cuts it; cu_infill: the file with the mask replaced by the middle (cut where the suffix
    starts or where a fill of the hole's shape ends); e2e: ``engine.answers.extract_program`` of the answer
    (the one rule for what an answer proposes); toy: the response itself."""
    plan = infill_plan(task)
    if plan is not None:
        middle, _ended = plan.finish(response_text, True)
        if task.cut is not None:
            if task.cut.line_aligned and middle.strip() and not middle.endswith("\n"):
                middle += "\n"  # whole lines in, whole lines out: the next line stays its own
            return task.cut.file_prefix + middle + task.cut.file_suffix
        return plan.prefix + middle + plan.suffix
    if task.kind == "e2e":
        return extract_program(response_text)
    return response_text


def make_task(
    record: dict[str, Any],
    kind: TaskKind | None = None,
    *,
    cu: CuPrompting = CuPrompting(),
    base_dir: str | Path | None = None,
) -> Task:
    """A task from one record (its kind from its fields unless given; ``cu``: how a ``.cu`` file becomes its
    prompt; ``base_dir``: what a ``.cu`` record's ``folder`` and ``include_paths`` are relative to, the task
    file's folder, else the working directory). ValueError naming the field for a record that does not fit
    the kind's schema, or whose folders do not exist."""
    kind = kind or kind_of(record)
    _check_fields(record, kind)
    task_id = str(record["id"])
    if kind == "infill":
        if record["prefix"] + record["middle"] + record["suffix"] != record["cuda_code"]:
            raise ValueError("prefix + middle + suffix differs from cuda_code")
        return Task(task_id, kind, _level(record), _prompt_of(kind, record, None), record)
    if kind == "cu_infill":
        count = record["text"].count(MASK)
        if count != 1:
            raise ValueError(f"text must hold exactly one {MASK} (it holds {count})")
        headers = _cu_headers(record, base_dir)
        cut = cu_cut(record["text"], cu)
        return Task(task_id, kind, CU_LEVEL, _prompt_of(kind, record, cut), record, cut, headers)
    if kind == "e2e":
        return Task(
            task_id, kind, _level(record), kernelbench_prompt(record["pytorch_code"], variant="rl"), record
        )
    return Task(task_id, kind, _level(record), record["prompt"], record)


def _cu_headers(record: dict[str, Any], base_dir: str | Path | None) -> CuHeaders | None:
    """The record's ``folder`` / ``include_paths`` resolved against ``base_dir`` (None when it has neither).
    The folders must exist: a task file moved without its ``cu_projects/`` would otherwise score every fill,
    the original included, as a compile error."""
    folder, paths = record.get("folder"), record.get("include_paths")
    if folder is None and paths is None:
        return None
    if not isinstance(folder, str) or not folder:
        raise ValueError(f"field 'folder' must be a non-empty string, got {folder!r}")
    if paths is None:
        paths = []
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise ValueError(f"field 'include_paths' must be a list of non-empty strings, got {paths!r}")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    resolved = []
    for name, value in [("folder", folder), *(("include_paths", p) for p in paths)]:
        full = os.path.normpath(os.path.abspath(base / value))
        if not os.path.isdir(full):
            raise ValueError(f"{name} {value!r} is not a folder (looked for {full})")
        resolved.append(full)
    return CuHeaders(resolved[0], tuple(resolved[1:]))


def _prompt_of(kind: str, record: dict[str, Any], cut: CuCut | None) -> str:
    plan = _plan(kind, record, cut)
    assert plan is not None
    return plan.prompt_text


def _check_fields(record: dict[str, Any], kind: str) -> None:
    for name, typ in _REQUIRED[kind].items():
        if name not in record:
            raise ValueError(
                f"missing field {name!r} (a {KIND_FILES[kind]} record needs {sorted(_REQUIRED[kind])})"
            )
        value = record[name]
        ok = isinstance(value, typ) and not isinstance(value, bool)
        if name == "id" and isinstance(value, int) and not isinstance(value, bool):
            ok = True  # DICE's own files number their records
        if not ok:
            raise ValueError(f"field {name!r} must be {typ.__name__}, got {type(value).__name__}")
    if "has_spec" in record and not isinstance(record["has_spec"], bool):
        raise ValueError(f"field 'has_spec' must be bool, got {type(record['has_spec']).__name__}")


def _level(record: dict[str, Any]) -> int:
    """The record's level; none (a missing or null ``level``) is scheduled as a single op, as
    ``training.rl.schedule`` does."""
    level = record.get("level")
    if level is None:
        return CU_LEVEL
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise ValueError(f"field 'level' must be a positive int, got {level!r}")
    return level


def read_task_file(path: str | Path, *, cu: CuPrompting = CuPrompting()) -> list[Task]:
    """Every task of one JSON Lines file, in file order; blank lines are skipped. Every record must be of the
    kind of the file's first record. :class:`TaskFileError` names the file, the line and the reason."""
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"{path}: no such task file")
    tasks: list[Task] = []
    kind: TaskKind | None = None
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise TaskFileError(f"{where}: not JSON ({exc})") from None
            if not isinstance(record, dict):
                raise TaskFileError(f"{where}: a task record is a JSON object, got {type(record).__name__}")
            try:
                this = kind_of(record)
                if kind is not None and this != kind:
                    raise ValueError(
                        f"a {KIND_FILES[this]} record in a file of {KIND_FILES[kind]} records "
                        "(one kind per file)"
                    )
                kind = this
                tasks.append(make_task(record, this, cu=cu, base_dir=path.parent))
            except ValueError as exc:
                ident = f" (id {record['id']!r})" if "id" in record else ""
                raise TaskFileError(f"{where}{ident}: {exc}") from None
    return tasks


def load_tasks(
    paths: str | Path | Sequence[str | Path], phase: str, *, cu: CuPrompting = CuPrompting()
) -> list[Task]:
    """The tasks of ``paths`` (CuKe's ``infill.jsonl``, ``cu_infill.jsonl``, ``e2e.jsonl``) in the order
    given and, within a file, in file order: that order is the data schedule. ``phase`` ``"infill"`` takes
    infill and .cu infill files, ``"e2e"`` end-to-end files (toy files fit both). :class:`TaskFileError`
    for a file whose kind does not fit the phase, an empty file, a bad record, or a task id seen twice."""
    if phase not in PHASE_KINDS:
        raise ValueError(f"unknown phase {phase!r} (use one of {', '.join(PHASE_KINDS)})")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for path in paths:
        file_tasks = read_task_file(path, cu=cu)
        if not file_tasks:
            raise TaskFileError(f"{path}: no tasks in the file")
        kind = file_tasks[0].kind
        if kind not in PHASE_KINDS[phase]:
            fits = " or ".join(KIND_FILES[k] for k in PHASE_KINDS[phase] if k != "toy")
            raise TaskFileError(
                f"{path}: holds {KIND_FILES[kind]} tasks ({kind}), which phase {phase!r} does not take "
                f"(phase {phase!r} reads {fits})"
            )
        for task in file_tasks:
            if task.id in seen:
                raise TaskFileError(
                    f"{path}: task id {task.id!r} also in {seen[task.id]} (ids must be unique)"
                )
            seen[task.id] = str(path)
        tasks += file_tasks
    return tasks
