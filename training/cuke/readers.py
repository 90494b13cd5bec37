"""CuKe's readers: every source format a user will have, schema-checked, as :class:`Pair` / :class:`CuFile`.

``dice cuke build --source PATH [--format F]`` takes whatever pairs a user has, so the format is told from the
file names or else from the keys of the first record (:func:`detect_format`). Every record is checked here,
before any stage sees it, so that a bad one fails with its file, its place ("record 17" of a JSON list, "line
17" of JSON Lines, "row 17" of parquet, counted from 1) and the reason, not with a KeyError three stages
later. Files are opened only after :func:`dice.safeio.check_user_file` (no folders, FIFOs, devices, nothing
over the data limit). Nothing here runs code, uses the network or writes. What each format yields is in the
docstring of its reader below. Numbers a source claims (speedups, scores, ranks) go into ``meta`` as
``claimed_*`` / ``rank``: what the source says, never what CuKe measured.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from dice import safeio
from training.cuke.records import KB_VERSIONS, CuFile, Pair, ReadError

PR67_SOURCE = "kernelbench-pr67-dsr1"
KERNELBENCH_SOURCE = "kernelbench"

# File names that say the format by themselves (fnmatch patterns); a folder read in one of these formats
# takes only the files they match. PR-67 upstream has best_1/2/3 variants holding the same answers again
# (SOURCE.md), so only the best-4 files are taken.
_NAMED: dict[str, tuple[str, ...]] = {
    "dice-cuke": ("CuKe_dataset*.json",),
    "dice-infill": ("kernel_infilling_*.json",),
    "dice-e2e": ("end_to_end_*.json",),
    "kernelbench-problems": ("problems.jsonl",),
    "cuda-corpus": ("files.jsonl", "files.jsonl.gz", "*.cu", "*.cuh"),
    "pr67": ("sft_dataset_best_4_*.parquet",),
}
_DATA_SUFFIXES = (".json", ".jsonl", ".jsonl.gz", ".parquet")
_CU_SUFFIXES = (".cu", ".cuh")
# The keys of a first record that say its format, most specific first.
_SNIFF: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"pytorch_code", "prefix", "middle", "suffix"}), "dice-infill"),
    (frozenset({"pytorch_code", "raw_answer"}), "dice-e2e"),
    (frozenset({"pytorch_code"}), "kernelbench-pairs"),
    (frozenset({"ref_code", "custom_code"}), "cuda-l1"),
    (frozenset({"question", "answer"}), "pr67"),
    (frozenset({"prompt", "response"}), "dice-cuke"),
    (frozenset({"repo", "path", "text"}), "cuda-corpus"),
    (frozenset({"level", "problem_id", "code"}), "kernelbench-problems"),
)
_MODEL = re.compile(r"\bclass\s+Model\b")
_MODEL_NEW = re.compile(r"\bModelNew\b")
# DICE's infilling prompt shows the reference after this phrase (engine/templates/kernel_infilling_rl.txt).
_GIVEN_ARCH = re.compile(r"the following architecture:?\s*```[^\n]*\n(.*?)```", re.DOTALL)

Record = Pair | CuFile
Item = tuple[str | None, Record | ReadError]  # (where in the file, what it holds)


class _Invalid(Exception):
    """A record that breaks its schema (``str()`` is the reason); the reader adds the file and the place."""


@dataclass(frozen=True)
class _Ctx:
    file: Path
    index: int  # 0-based position among the file's records (positional ids)

    @property
    def tag(self) -> str:
        return self.file.name

    def pair(self, reference: str, candidate: str | None, *, id: str | None = None, **fields: Any) -> Pair:
        """A Pair of this record: id "<file name>:<index>" and source the file name unless given."""
        fields.setdefault("source", self.tag)
        return Pair(
            id=id or f"{self.tag}:{self.index}", pytorch_code=reference, cuda_code=candidate, **fields
        )


# ------------------------------------------------------------------------------------------- public API


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a source file or folder: by file names first, then by the keys of the first record.

    ReadError when the path cannot be read (missing, a FIFO, too large) or matches no format; the message
    lists the formats and says that ``--format`` can name one.
    """
    path = Path(path)
    if path.is_dir():
        fmt = _detect_folder(path)
    elif (refusal := _refusal(path)) is not None:
        raise refusal
    else:
        fmt = _by_name(path.name) or _sniff(path, quiet=False)
    if fmt is None:
        raise ReadError(str(path), None, _UNKNOWN)
    return fmt


def read_source(
    path: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    limit: int | None = None,
    on_error: Callable[[ReadError], None] | None = None,
) -> Iterator[Record]:
    """The records of a source file or folder, schema-checked, at most ``limit`` of them.

    The format is detected unless ``fmt`` names one of :data:`FORMATS`. A bad record raises its ReadError
    (file, place, reason), unless ``on_error`` is given: then it is called with the error and the record
    skipped (a file that cannot be parsed at all is skipped whole). Ids are unique within the source; a
    repeated one is a bad record. The path itself is checked now (a missing path, a FIFO, an unknown
    format raise at the call); the records are read lazily.
    """
    path = Path(path)
    if fmt is None:
        fmt = detect_format(path)
    elif fmt not in FORMATS:
        raise ReadError(str(path), None, f"unknown format {fmt!r}; the formats are: {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    files = _source_files(path, fmt)
    return _iterate(files, fmt, limit, on_error)


def _refusal(path: Path) -> ReadError | None:
    """Why ``path`` is not read (a folder, FIFO, device, missing, over the data limit), else None."""
    try:
        safeio.check_user_file(path, max_bytes=safeio.DATA_LIMIT, what="data file")
    except safeio.UserFileError as exc:
        return ReadError(str(path), None, exc.reason)
    return None


def _by_name(name: str) -> str | None:
    return next((fmt for fmt, pats in _NAMED.items() if any(fnmatch(name, p) for p in pats)), None)


def _sniff(path: Path, *, quiet: bool) -> str | None:
    """The format the first record's keys say (a parquet file's columns); None when unknown. ``quiet``:
    a file that cannot be read is unknown rather than an error (a folder's stray files)."""
    _where, first = next(iter(_records(path)), (None, None))
    if isinstance(first, ReadError):
        if quiet:
            return None
        raise first
    if not isinstance(first, dict):
        return None
    keys = set(first)
    return next((fmt for need, fmt in _SNIFF if need <= keys), None)


def _data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(_DATA_SUFFIXES) and not p.is_dir())


def _cu_files(folder: Path) -> Iterator[Path]:
    """The .cu / .cuh files under ``folder`` in a stable order; hidden folders (.git) are not entered."""
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.endswith(_CU_SUFFIXES):
                yield Path(root) / name


def _detect_folder(folder: Path) -> str | None:
    """The one format of the folder's data files (stray JSON such as a build report sniffs as none), else
    cuda-corpus for a tree of .cu / .cuh files."""
    found: dict[str, list[str]] = {}
    for file in _data_files(folder):
        fmt = _by_name(file.name) or _sniff(file, quiet=True)
        if fmt is not None:
            found.setdefault(fmt, []).append(file.name)
    if len(found) > 1:
        kinds = "; ".join(f"{fmt}: {', '.join(files)}" for fmt, files in sorted(found.items()))
        raise ReadError(str(folder), None, f"holds files of several formats ({kinds}); name one file")
    if found:
        return next(iter(found))
    return "cuda-corpus" if next(_cu_files(folder), None) is not None else None


def _source_files(path: Path, fmt: str) -> list[Path]:
    """The files a source holds in format ``fmt``: the file itself, or the folder's files of that format."""
    if not path.is_dir():
        if (refusal := _refusal(path)) is not None:
            raise refusal
        return [path]
    if fmt == "cuda-corpus":
        listed = [path / n for n in ("files.jsonl.gz", "files.jsonl") if (path / n).exists()]
        files = listed[:1] or ([path] if next(_cu_files(path), None) else [])  # [path]: its .cu tree
    elif fmt in _NAMED:
        files = [f for f in _data_files(path) if any(fnmatch(f.name, p) for p in _NAMED[fmt])]
    else:
        files = [f for f in _data_files(path) if _by_name(f.name) is None and _sniff(f, quiet=True) == fmt]
    if not files:
        wanted = f" ({', '.join(_NAMED[fmt])})" if fmt in _NAMED else ""
        raise ReadError(str(path), None, f"holds no {fmt} file{wanted}")
    return files


# --------------------------------------------------------------------------------------- reading files


def _iterate(
    files: list[Path], fmt: str, limit: int | None, on_error: Callable[[ReadError], None] | None
) -> Iterator[Record]:
    seen: set[str] = set()
    for file in files if limit != 0 else []:
        for where, item in _READERS[fmt](file):
            if not isinstance(item, ReadError) and item.id in seen:
                item = ReadError(str(file), where, f"duplicate id {item.id!r}")
            if isinstance(item, ReadError):
                if on_error is None:
                    raise item
                on_error(item)
                continue
            seen.add(item.id)
            yield item
            if len(seen) == limit:
                return


def _records(file: Path) -> Iterator[tuple[str | None, Any]]:
    """(where, decoded record or ReadError) for each record of a JSON, JSON Lines or parquet file; a file
    that cannot be read at all, or breaks off, gives a last (where, ReadError)."""
    refusal = _refusal(file)
    if refusal is not None:
        return iter([(None, refusal)])
    name = file.name
    if name.endswith(".parquet"):
        return _parquet_rows(file)
    if name.endswith((".jsonl", ".jsonl.gz", ".gz")):
        return _jsonl_file(file)
    return _json_file(file)


def _decode_line(file: Path, number: int, raw: bytes) -> tuple[str | None, Any]:
    where = f"line {number}"
    try:
        return where, json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return where, ReadError(str(file), where, f"not UTF-8 text (byte {exc.start} is invalid)")
    except json.JSONDecodeError as exc:
        return where, ReadError(str(file), where, f"not valid JSON: {exc}")


def _jsonl_file(file: Path) -> Iterator[tuple[str | None, Any]]:
    opener = gzip.open if file.name.endswith(".gz") else open
    number, total = 0, 0
    try:
        with opener(file, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                total += len(raw)
                if total > safeio.DATA_LIMIT:
                    yield None, ReadError(str(file), None, "decompresses to more than the data limit")
                    return
                if raw.strip():
                    yield _decode_line(file, number, raw)
    except (OSError, EOFError, zlib.error) as exc:
        where = f"line {number + 1}"
        yield where, ReadError(str(file), where, f"cannot read it: {exc}")


def _json_file(file: Path) -> Iterator[tuple[str | None, Any]]:
    """A JSON list (or an object holding one under "data" / "records"); a file of one object per line
    (CUDA-L1 names its JSON Lines files ``.json``) is read as JSON Lines."""
    try:
        text = safeio.read_user_text(file, max_bytes=safeio.DATA_LIMIT, what="data file")
    except safeio.UserFileError as exc:
        yield None, ReadError(str(file), None, exc.reason)
        return
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("{") and exc.msg == "Extra data":
            lines = text.encode("utf-8").split(b"\n")
            yield from (_decode_line(file, n, raw) for n, raw in enumerate(lines, 1) if raw.strip())
            return
        yield None, ReadError(str(file), None, f"not valid JSON: {exc}")
        return
    if isinstance(doc, dict):
        held = next((doc[k] for k in ("data", "records") if isinstance(doc.get(k), list)), None)
        doc = held if held is not None else [doc]
    if not isinstance(doc, list):
        reason = f"expected a list of records (or an object holding one), got {_kind(doc)}"
        yield None, ReadError(str(file), None, reason)
        return
    yield from ((f"record {n}", rec) for n, rec in enumerate(doc, 1))


def _parquet_rows(file: Path) -> Iterator[tuple[str | None, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(file).iter_batches(batch_size=256)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row
    except (pa.ArrowException, OSError) as exc:
        yield None, ReadError(str(file), None, f"not a readable parquet file: {exc}")


def _converted(file: Path, convert: Callable[[_Ctx, dict[str, Any]], Record]) -> Iterator[Item]:
    """Each record of ``file`` through ``convert``; a schema break becomes a ReadError naming the record."""
    for index, (where, rec) in enumerate(_records(file)):
        if isinstance(rec, ReadError):
            yield where, rec
            continue
        try:
            if not isinstance(rec, dict):
                raise _Invalid(f"not a JSON object (got {_kind(rec)})")
            item: Record | ReadError = convert(_Ctx(file, index), rec)
        except _Invalid as exc:
            item = ReadError(str(file), where, str(exc))
        yield where, item


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _opt(rec: dict[str, Any], key: str) -> str | None:
    """A string field that may be missing or null."""
    if rec.get(key) is not None and not isinstance(rec[key], str):
        raise _Invalid(f"{key!r} is not a string (got {_kind(rec[key])})")
    return rec.get(key)


def _req(rec: dict[str, Any], key: str) -> str:
    value = _opt(rec, key)
    if value is None:
        raise _Invalid(f"missing field {key!r}")
    return value


def _int(rec: dict[str, Any], key: str, *, required: bool = False) -> int | None:
    """An integer field; a string of digits counts (DICE writes levels as "1")."""
    value = rec.get(key)
    if value is None or value == "":
        if required:
            raise _Invalid(f"missing field {key!r}")
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise _Invalid(f"{key!r} is not an integer (got {repr(value)[:60]})")


def _number(rec: dict[str, Any], key: str) -> float | None:
    value = rec.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _Invalid(f"{key!r} is not a number (got {_kind(value)})")


def _reference(rec: dict[str, Any], key: str) -> str:
    code = _req(rec, key)
    if not _MODEL.search(code):
        raise _Invalid(f"{key!r} has no class Model")
    return code


def _candidate(rec: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    """A candidate program, None when null or blank (a reference-only record); text without ModelNew is
    not one."""
    if required and key not in rec:
        raise _Invalid(f"missing field {key!r}")
    code = _opt(rec, key)
    if code is None or not code.strip():
        return None
    if not _MODEL_NEW.search(code):
        raise _Invalid(f"{key!r} has no ModelNew")
    return code


def _record_id(rec: dict[str, Any], key: str, ctx: _Ctx) -> str:
    value = rec.get(key)
    if value is None:
        return f"{ctx.tag}:{ctx.index}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Invalid(f"{key!r} is not a string or an integer (got {_kind(value)})")
    return f"{ctx.tag}:{value}"


def _kb(version: str | None, level: int | None, problem_id: int | None) -> dict[str, Any]:
    """A Pair's KernelBench fields; the problem key by training.corpus.sources' rule (imported here: its
    package imports torch, which reading a .cu corpus need not wait for)."""
    from training.corpus.sources import problem_key

    problem = None if level is None or problem_id is None else problem_key(level, problem_id)
    return {"problem": problem, "kb_version": version, "level": level}


# ----------------------------------------------------------------------------------------------- formats


def _kernelbench_pair(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
    """A user's pair; its KernelBench version is the record's own (None when not said: never guessed). No
    ``cuda_code`` at all is a reference-only record (DICE's RL task files, e.g. ``kernelbench_level1.json``,
    carry ``pytorch_code`` alone)."""
    reference = _reference(rec, "pytorch_code")
    candidate = _candidate(rec, "cuda_code", required=False)
    level, problem_id = _int(rec, "level"), _int(rec, "problem_id")
    kb_version = _opt(rec, "kb_version")
    if kb_version is not None and kb_version not in KB_VERSIONS:
        raise _Invalid(f"'kb_version' must be 'v0', 'current' or null, not {kb_version!r}")
    speedup = _number(rec, "speedup")
    meta = {} if speedup is None else {"claimed_speedup": speedup}
    name = _opt(rec, "name")
    kb = _kb(kb_version, level, problem_id)
    return ctx.pair(reference, candidate, id=_record_id(rec, "id", ctx), name=name, meta=meta, **kb)


def _read_pr67(file: Path) -> Iterator[Item]:
    """PR-67's rows, through the same helpers as ``training.corpus.sources.read_pr67`` (the reference is the
    prompt's last code block, the program the one ``engine.answers.extract_program`` takes), but checked.

    Rows are up to 4 per problem, fastest first (SOURCE.md): ``meta["rank"]`` is that position, the only
    claim the rows carry. ``best_k_kernels_level*.json`` beside them is not read: it holds no code, only
    the RTX A6000 eval records behind these answers, joinable by (level, problem, rank) by inference only.
    """
    from engine.answers import extract_program
    from training.corpus.sources import _extract_reference

    split = file.stem.rsplit("_", 1)[-1]
    ranks: dict[str, int] = {}

    def convert(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
        question, answer = _req(rec, "question"), _req(rec, "answer")
        level, problem_id = _int(rec, "level", required=True), _int(rec, "problem", required=True)
        reference = _extract_reference(question)
        if reference is None or not _MODEL.search(reference):
            raise _Invalid("'question' holds no reference architecture (class Model in a code block)")
        program = extract_program(answer)
        kb = _kb("v0", level, problem_id)
        key = kb["problem"]
        rank = ranks[key] = ranks.get(key, -1) + 1
        candidate = program if _MODEL_NEW.search(program) else None  # else the reference echoed back
        meta = {"split": split, "rank": rank}
        return ctx.pair(
            reference, candidate, id=f"{PR67_SOURCE}:{key}:{rank}", source=PR67_SOURCE, meta=meta, **kb
        )

    return _converted(file, convert)


def _read_cuda_l1(file: Path) -> Iterator[Item]:
    """CUDA-L1's records: ``custom_code`` null, blank or the string "None" is a reference without a
    candidate (40 on H100, 25 on A100; 33 of them "None" with scores but no code to back them).
    ``score_default`` is the claimed eager speedup; the other scores are kept as claims too."""
    source = f"cuda-l1/{file.stem}"

    def convert(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
        level, task = _int(rec, "level_id", required=True), _int(rec, "task_id", required=True)
        reference = _reference(rec, "ref_code")
        code = _opt(rec, "custom_code")
        if code is not None and code.strip() not in ("", "None"):
            code = _candidate(rec, "custom_code")
        else:
            code = None
        scores = {k: _number(rec, k) for k in rec if k.startswith("score_") and rec[k] is not None}
        kb = _kb("v0", level, task)
        meta = {"gpu": file.stem.upper(), "claimed_speedup": scores.get("score_default"), "claimed": scores}
        return ctx.pair(reference, code, id=f"{source}:{kb['problem']}", source=source, meta=meta, **kb)

    return _converted(file, convert)


def _prompt_reference(prompt: str) -> str | None:
    """The reference architecture of a DICE prompt: KernelBench's one-shot prompt (the last code block
    before "Optimize the architecture named Model", the rule of ``training.corpus.sources``), else the block
    after "the following architecture" (DICE's infilling prompt)."""
    from training.corpus.sources import _extract_reference

    reference = _extract_reference(prompt)
    if reference is not None and _MODEL.search(reference):
        return reference
    match = _GIVEN_ARCH.search(prompt)
    if match and _MODEL.search(match.group(1)):
        return match.group(1).strip() + "\n"
    return None


def _dice_cuke(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
    """A CuKe SFT sample; the response's program is the one ``dice eval`` would take from it (an answer
    without ModelNew is a reference without a candidate). Which problem and version: unknown."""
    from engine.answers import extract_program

    reference = _prompt_reference(_req(rec, "prompt"))
    if reference is None:
        raise _Invalid("'prompt' holds no reference architecture (class Model in a code block)")
    program = extract_program(_req(rec, "response"))
    return ctx.pair(reference, program if _MODEL_NEW.search(program) else None)


def _dice_infill(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
    """An infilling task; its split is kept in ``meta`` only if it rebuilds the solution exactly."""
    reference = _reference(rec, "pytorch_code")
    program = _candidate(rec, "cuda_code")
    if program is None:
        raise _Invalid("'cuda_code' is empty (an infilling task needs the whole solution)")
    parts = {k: _req(rec, k) for k in ("prefix", "middle", "suffix")}
    joined = parts["prefix"] + parts["middle"] + parts["suffix"]
    if joined != program:
        at = len(os.path.commonprefix([joined, program]))
        raise _Invalid(f"prefix + middle + suffix is not cuda_code (they differ from character {at})")
    return ctx.pair(reference, program, id=_record_id(rec, "id", ctx), level=_int(rec, "level"), meta=parts)


def _dice_e2e(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
    """DICE's end-to-end tasks; ``level`` is DICE's own label ("0" to "3", strings), ``raw_answer`` the
    classifier answer it came from."""
    reference, candidate = _reference(rec, "pytorch_code"), _candidate(rec, "cuda_code", required=False)
    raw_answer = _opt(rec, "raw_answer")
    meta = {} if raw_answer is None else {"raw_answer": raw_answer}
    return ctx.pair(reference, candidate, id=_record_id(rec, "idx", ctx), level=_int(rec, "level"), meta=meta)


def _corpus_record(ctx: _Ctx, rec: dict[str, Any]) -> CuFile:
    """A corpus file; ``sha256`` / ``bytes``, when given, must describe the text (a corrupted copy fails)."""
    repo, path, text = _req(rec, "repo"), _req(rec, "path"), _req(rec, "text")
    data = text.encode("utf-8", "surrogatepass")
    sha = _opt(rec, "sha256")
    if sha is not None and hashlib.sha256(data).hexdigest() != sha.lower():
        raise _Invalid("'sha256' does not match the text")
    size = _int(rec, "bytes")
    if size is not None and size != len(data):
        raise _Invalid(f"'bytes' is {size} but the text has {len(data)}")
    return CuFile(
        id=f"{repo}:{path}",
        repo=repo,
        path=path,
        text=text,
        license=_opt(rec, "license"),
        commit=_opt(rec, "commit"),
        source=ctx.file.parent.name or ctx.tag,
    )


def _read_corpus(path: Path) -> Iterator[Item]:
    """``files.jsonl(.gz)`` records, or the .cu / .cuh files of a folder (repo = the folder's name)."""
    if not path.is_dir() and not path.name.endswith(_CU_SUFFIXES):
        yield from _converted(path, _corpus_record)
        return
    root = path if path.is_dir() else path.parent
    for file in _cu_files(path) if path.is_dir() else iter([path]):
        rel = file.relative_to(root).as_posix()
        try:
            text = safeio.read_user_text(file, max_bytes=safeio.SOURCE_LIMIT, what="CUDA source")
        except safeio.UserFileError as exc:
            yield None, ReadError(str(file), None, exc.reason)
            continue
        yield None, CuFile(id=f"{root.name}:{rel}", repo=root.name, path=rel, text=text, source=root.name)


def _kernelbench_problem(ctx: _Ctx, rec: dict[str, Any]) -> Pair:
    """A current KernelBench problem: a reference without a candidate (evaluation and augmentation input)."""
    level, problem_id = _int(rec, "level", required=True), _int(rec, "problem_id", required=True)
    kb, reference, name = _kb("current", level, problem_id), _reference(rec, "code"), _opt(rec, "name")
    pair_id = f"{KERNELBENCH_SOURCE}:{kb['problem']}"
    return ctx.pair(reference, None, id=pair_id, source=KERNELBENCH_SOURCE, name=name, **kb)


_READERS: dict[str, Callable[[Path], Iterator[Item]]] = {
    "kernelbench-pairs": lambda f: _converted(f, _kernelbench_pair),
    "pr67": _read_pr67,
    "cuda-l1": _read_cuda_l1,
    "dice-cuke": lambda f: _converted(f, _dice_cuke),
    "dice-infill": lambda f: _converted(f, _dice_infill),
    "dice-e2e": lambda f: _converted(f, _dice_e2e),
    "cuda-corpus": _read_corpus,
    "kernelbench-problems": lambda f: _converted(f, _kernelbench_problem),
}
FORMATS: tuple[str, ...] = tuple(_READERS)  # the names --format takes
_UNKNOWN = f"cannot tell which format this is; the formats are: {', '.join(FORMATS)} (name one with --format)"

__all__ = ["FORMATS", "KERNELBENCH_SOURCE", "PR67_SOURCE", "detect_format", "read_source"]
