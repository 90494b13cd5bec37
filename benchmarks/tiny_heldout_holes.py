"""The hole sets of ``benchmarks/tiny_heldout.py``: the statement-line sampler, the editor's mask, and where
each set's files live while they are checked and filled.

- ``realproj``: ``../shared/data/realproj`` copied to a temporary folder with its ``compile_commands.json``
  (``realproj_compile.copy_realproj``); workspace: the copy; every file compiled by its project's command.
- ``heldout-files``: the corpus files that ``dice train corpus`` held out *by file* (``split.json``:
  ``heldout_files`` entries with ``why == "file"``; their projects' other files were trained on), read from
  ``heldout_files.jsonl.gz`` (cuda-corpus rows: repo, path, text, ...). Each ``.cu``/``.cuh`` file is written
  alone into its own temporary workspace at its repository path (``<tmp>/<k>/<owner>+<repo>/<path>``, the
  workspace root being ``<tmp>/<k>/<owner>+<repo>``), with no compile database: the product's fallback
  (NVRTC on the device code; nvcc on the whole file with the file's folder and the workspace on the include
  path). Its project's headers are not there, so most of these files do not compile.

Imported by ``benchmarks/tiny_heldout.py`` (``benchmarks/`` is on ``sys.path``, as for ``realproj_compile``).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from realproj_compile import copy_realproj, replace_line, statement_lines  # noqa: E402

from dice.cuda_source import parse_bytes, parse_document  # noqa: E402
from dice.cuda_source.positions import encode_text  # noqa: E402

MASK = "/* <MASK> */"
MASK_SUFFIXES = (".cu", ".cuh", ".cuda")  # the files the editor and `dice complete` fill
MIN_CHARS, MAX_CHARS = 6, 160
TRIVIAL = {"return;", "break;", "continue;", "}"}
SETS = ("realproj", "heldout-files")


@dataclasses.dataclass(frozen=True)
class HoleSpec:
    project: str
    file: str  # relative to the set's base folder for this file, "<owner>+<repo>/..."
    line: int  # 0-based
    original: str  # the statement, stripped


@dataclasses.dataclass
class HoleSet:
    """One set's holes, in the order they are tried, and where their files are."""

    name: str  # one of SETS
    holes: list[HoleSpec]
    bases: dict[str, Path]  # HoleSpec.file -> the folder it is relative to
    workspaces: dict[str, Path]  # HoleSpec.file -> the editor's workspace root for it
    compile_commands: Path | None  # None: no compile database (the validator's fallback)
    info: dict[str, Any]  # for the results' header
    stop_after: int | None = None  # try holes until this many are checkable (None: try them all)
    file_precheck: bool = False  # compile each untouched file once first; if it fails, so do its holes

    def path(self, hole: HoleSpec) -> Path:
        return self.bases[hole.file] / hole.file


# ------------------------------------------------------------------------------------------------ holes
def hole_lines(text: str) -> list[int]:
    """0-based lines that hold exactly one whole statement inside a function body (see the module doc of
    ``tiny_heldout``)."""
    data = encode_text(text)
    root = parse_bytes(data).root_node
    doc = parse_document(text)
    # tree-sitter's recovery can stretch a function over the rest of the file (macro-heavy code): not a body
    bodies = [
        (doc.index.line_of_byte(f.body_start_byte), doc.index.line_of_byte(f.body_end_byte))
        for f in doc.functions
        if not f.recovered
    ]
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(encode_text(line)))
    lines = text.splitlines()
    out = []
    for n in statement_lines(text):
        content = lines[n].strip()
        if not MIN_CHARS <= len(content) <= MAX_CHARS or content in TRIVIAL:
            continue
        if not any(first < n < last for first, last in bodies):
            continue
        raw = lines[n]
        start = starts[n] + len(encode_text(raw[: len(raw) - len(raw.lstrip())]))
        if _whole_statement(root, start, start + len(encode_text(content))):
            out.append(n)
    return out


def _whole_statement(root: Any, start: int, end: int) -> bool:
    node = root.named_descendant_for_byte_range(start, end)
    while node is not None and node.start_byte == start and node.end_byte == end:
        if node.type == "declaration" or (
            node.type.endswith("_statement") and node.type != "compound_statement"
        ):
            return True
        node = node.parent
    return False


def mask_line(text: str, line: int) -> str:
    """The file with ``line`` replaced by the editor's mask comment at the line's indentation."""
    return replace_line(text, line, MASK)


def sample_texts(texts: dict[str, str], n: int, seed: int, per_file: int = 3) -> list[HoleSpec]:
    """``n`` holes from ``texts`` (relative path -> text; the project is the path's first folder), seeded:
    round-robin over projects; within a project, one hole per file in a shuffled file order before any
    file's second, at most ``per_file`` per file."""
    rng = random.Random(seed)
    by_project: dict[str, list[list[HoleSpec]]] = {}
    for rel, text in texts.items():
        lines = text.splitlines()
        picks = [HoleSpec(rel.split("/")[0], rel, k, lines[k].strip()) for k in hole_lines(text)]
        rng.shuffle(picks)
        if picks:
            by_project.setdefault(rel.split("/")[0], []).append(picks[:per_file])
    queues = {}
    for project, per in sorted(by_project.items()):
        rng.shuffle(per)
        queues[project] = [p[k] for k in range(per_file) for p in per if k < len(p)]
    out: list[HoleSpec] = []
    while len(out) < n and any(queues.values()):
        for project in sorted(queues):
            if queues[project] and len(out) < n:
                out.append(queues[project].pop(0))
    return out


def sample_holes(root: Path, files: list[str], n: int, seed: int, per_file: int = 3) -> list[HoleSpec]:
    """:func:`sample_texts` over ``files`` (relative to ``root``), in their order."""
    texts = {rel: (root / rel).read_text(encoding="utf-8", errors="replace") for rel in files}
    return sample_texts(texts, n, seed, per_file)


def _matches(rel: str, projects: list[str] | None) -> bool:
    return not projects or any(p.lower() in rel.split("/")[0].lower() for p in projects)


# ------------------------------------------------------------------------------------------------ realproj
def candidate_files(root: Path, projects: list[str] | None = None) -> list[str]:
    """The realproj files the editor fills (TUs and headers with a mask suffix), relative, sorted."""
    tus = [e["file"] for e in json.loads((root / "compile_commands.template.json").read_text())]
    headers_file = root / "headers.json"
    headers = list(json.loads(headers_file.read_text())) if headers_file.is_file() else []
    files = sorted({f for f in tus + headers if f.endswith(MASK_SUFFIXES)})
    return [f for f in files if _matches(f, projects)]


def realproj_set(
    source: Path, dest: Path, n: int, seed: int, per_file: int, projects: list[str] | None = None
) -> HoleSet:
    """``n`` holes of the realproj copy at ``dest`` (every hole checked; the checkable ones filled)."""
    root = copy_realproj(source, dest)
    files = candidate_files(root, projects)
    texts = {rel: (root / rel).read_text(encoding="utf-8", errors="replace") for rel in files}
    holes = sample_texts(texts, n, seed, per_file)
    info = {
        "source": shown_path(source),
        "files": len(files),
        "hole_lines": sum(len(hole_lines(t)) for t in texts.values()),
        "per_file": per_file,
        "sampled": len(holes),
    }
    return HoleSet(
        "realproj",
        holes,
        dict.fromkeys(files, root),
        dict.fromkeys(files, root),
        root / "compile_commands.json",
        info,
    )


# ---------------------------------------------------------------------------------------------- heldout-files
def shown_path(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (the results' header)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def project_folder(repo: str) -> str:
    """``owner/name`` -> ``owner+name`` (realproj's folder names)."""
    return repo.replace("/", "+")


def heldout_by_file(heldout: Path, split: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of ``heldout`` (cuda-corpus jsonl.gz) that ``split`` (split.json) holds out by file and the
    editor fills (mask suffix), sorted by id; and counts for the results' header."""
    plan = json.loads(split.read_text())
    whys = {e["id"]: e["why"] for e in plan.get("heldout_files", [])}
    rows, skipped_suffix, held_by_file = [], 0, 0
    with gzip.open(heldout, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            ident = row.get("id") or f"{row['repo']}:{row['path']}"
            if whys.get(ident) != "file":
                continue
            held_by_file += 1
            if not row["path"].endswith(MASK_SUFFIXES):
                skipped_suffix += 1
                continue
            rows.append({**row, "id": ident})
    rows.sort(key=lambda r: r["id"])
    counts = {
        "split_heldout_by_file": sum(1 for w in whys.values() if w == "file"),
        "split_heldout_by_project": sum(1 for w in whys.values() if w == "project"),
        "rows_held_out_by_file": held_by_file,
        "rows_not_cu": skipped_suffix,
    }
    return rows, counts


def heldout_files_set(
    heldout: Path,
    split: Path,
    dest: Path,
    *,
    checkable: int,
    max_sampled: int,
    seed: int,
    per_file: int,
    projects: list[str] | None = None,
) -> HoleSet:
    """Up to ``max_sampled`` holes of the held-out-by-file files, each file alone in its own workspace under
    ``dest``; they are tried in order until ``checkable`` of them are checkable."""
    rows, counts = heldout_by_file(heldout, split)
    texts: dict[str, str] = {}
    bases: dict[str, Path] = {}
    workspaces: dict[str, Path] = {}
    for k, row in enumerate(r for r in rows if _matches(project_folder(r["repo"]), projects)):
        rel = f"{project_folder(row['repo'])}/{row['path']}"
        base = dest / f"{k:03d}"
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(row["text"].encode("utf-8"))
        texts[rel] = (base / rel).read_text(encoding="utf-8", errors="replace")
        bases[rel] = base
        workspaces[rel] = base / project_folder(row["repo"])
    holes = sample_texts(texts, max_sampled, seed, per_file)
    from dice.validator.compdb import database_candidates

    info = {
        "source": shown_path(heldout),
        "split": shown_path(split),
        **counts,
        "files": len(texts),
        "projects": len({rel.split("/")[0] for rel in texts}),
        "hole_lines": sum(len(hole_lines(t)) for t in texts.values()),
        "per_file": per_file,
        "max_sampled": max_sampled,
        "target_checkable": checkable,
        "candidate_holes": len(holes),
        # compile databases the validator would find above the workspaces (none: its fallback decides)
        "databases_above": database_candidates(dest),
    }
    return HoleSet(
        "heldout-files", holes, bases, workspaces, None, info, stop_after=checkable, file_precheck=True
    )
