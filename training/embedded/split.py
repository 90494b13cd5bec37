"""The held-out split of the real-code corpus, drawn before anything is trained, and its deduplication.

- **Held-out projects**: whole repositories (default :data:`DEFAULT_HOLDOUT_PROJECTS`, the two corpus projects
  that ``../shared/data/realproj`` also holds as never-seen compilable trees), plus ``extra_projects`` more
  chosen by a seeded hash of the repository name.
- **Held-out files**: of the other projects, the files whose seeded hash of ``repo:path`` falls under
  ``file_fraction`` (stable: a file's side does not depend on the rest of the corpus).
- **Deduplication**: a training file that is an exact or near duplicate (normalised text, MinHash/LSH over
  word 5-shingles, exact Jaccard >= ``threshold``: ``training.cuke.dedup``) of a held-out file or of a file
  of the reference trees (realproj) is dropped; of exact duplicates within training the first is kept.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.cuke.dedup import MinHashIndex, normalize_code
from training.cuke.records import CuFile

DEFAULT_HOLDOUT_PROJECTS = ("ggml-org/ggml", "NVIDIA/CUDALibrarySamples")
DEFAULT_FILE_FRACTION = 0.05
DEFAULT_THRESHOLD = 0.8
# The text files of a reference tree compared against the training files.
REFERENCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".hxx")
_REFERENCE_LIMIT = 4 << 20  # bytes: a larger file under a reference tree is not source code


@dataclass(frozen=True)
class SplitConfig:
    holdout_projects: tuple[str, ...] = DEFAULT_HOLDOUT_PROJECTS
    extra_projects: int = 0  # more held-out projects, picked by a seeded hash of their name
    file_fraction: float = DEFAULT_FILE_FRACTION
    seed: int = 0
    threshold: float = DEFAULT_THRESHOLD

    def validate(self) -> None:
        if not 0.0 <= self.file_fraction < 1.0:
            raise ValueError(f"the held-out file fraction must be in [0, 1), got {self.file_fraction}")
        if self.extra_projects < 0:
            raise ValueError(f"extra held-out projects must be >= 0, got {self.extra_projects}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"the near-duplicate threshold must be in (0, 1], got {self.threshold}")


@dataclass(frozen=True)
class Duplicate:
    """A training file left out: ``reason`` "exact" / "near" (of a held-out or reference file) or
    "exact-in-train" (a copy of a kept training file); ``match`` the file it duplicates."""

    id: str
    reason: str
    match: str
    similarity: float


@dataclass
class CorpusSplit:
    train: list[CuFile]
    heldout: list[CuFile]
    heldout_projects: list[str]
    absent_projects: list[str]  # asked to be held out but not in the corpus
    heldout_why: dict[str, str]  # held-out file id -> "project" | "file"
    dropped: list[Duplicate] = field(default_factory=list)
    references: int = 0  # files of the reference trees compared against
    threshold: float = DEFAULT_THRESHOLD

    def to_json(self) -> dict[str, Any]:
        """What ``split.json`` holds."""
        return {
            "heldout_projects": self.heldout_projects,
            "absent_projects": self.absent_projects,
            "heldout_files": [{"id": f.id, "why": self.heldout_why[f.id]} for f in self.heldout],
            "dropped_as_duplicate": [asdict(d) for d in self.dropped],
            "counts": self.counts(),
        }

    def counts(self) -> dict[str, int]:
        reasons: dict[str, int] = {}
        for d in self.dropped:
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
        return {
            "files": len(self.train) + len(self.heldout) + len(self.dropped),
            "train": len(self.train),
            "heldout": len(self.heldout),
            "heldout_by_project": sum(1 for w in self.heldout_why.values() if w == "project"),
            "heldout_by_file": sum(1 for w in self.heldout_why.values() if w == "file"),
            "dropped_as_duplicate": len(self.dropped),
            **{f"dropped_{k}": v for k, v in sorted(reasons.items())},
            "reference_files": self.references,
        }


def unit_hash(seed: int, key: str) -> float:
    """A stable number in [0, 1] for ``key`` under ``seed``."""
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def heldout_projects(repos: Iterable[str], cfg: SplitConfig) -> tuple[list[str], list[str]]:
    """(held-out projects present in ``repos``, named projects absent from them): the named ones plus
    ``cfg.extra_projects`` of the others, lowest seeded hash first."""
    present = sorted(set(repos))
    named = [p for p in dict.fromkeys(cfg.holdout_projects) if p]
    held = [p for p in named if p in present]
    others = sorted((p for p in present if p not in held), key=lambda p: (unit_hash(cfg.seed, p), p))
    held += others[: cfg.extra_projects]
    return sorted(held), [p for p in named if p not in present]


def read_corpus(path: Path, on_error=None) -> list[CuFile]:
    """The files of a cuda-corpus source (``files.jsonl(.gz)`` or a folder of them / of .cu files)."""
    from training.cuke.readers import read_source

    return [f for f in read_source(path, "cuda-corpus", on_error=on_error) if isinstance(f, CuFile)]


def read_reference_tree(folder: Path) -> list[tuple[str, str]]:
    """``(id, text)`` of the source files under ``folder`` (:data:`REFERENCE_SUFFIXES`), in a stable order;
    id ``<folder name>:<relative path>``; files that are not UTF-8 are read with replacement characters."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            if not name.endswith(REFERENCE_SUFFIXES) or not path.is_file():
                continue
            if path.stat().st_size > _REFERENCE_LIMIT:
                continue
            rel = path.relative_to(folder).as_posix()
            out.append((f"{folder.name}:{rel}", path.read_bytes().decode("utf-8", "replace")))
    return out


def split_corpus(
    files: Sequence[CuFile], cfg: SplitConfig, references: Sequence[tuple[str, str]] = ()
) -> CorpusSplit:
    """Held-out projects and files, then the training files that duplicate a held-out or reference file
    (or an earlier training file, exactly) dropped. Input order is kept on each side."""
    cfg.validate()
    held_projects, absent = heldout_projects((f.repo for f in files), cfg)
    held_set = set(held_projects)
    why: dict[str, str] = {}
    train: list[CuFile] = []
    heldout: list[CuFile] = []
    for f in files:
        if f.repo in held_set:
            why[f.id] = "project"
        elif cfg.file_fraction > 0 and unit_hash(cfg.seed, f.id) < cfg.file_fraction:
            why[f.id] = "file"
        else:
            train.append(f)
            continue
        heldout.append(f)
    kept, dropped = _drop_duplicates(train, [(f.id, f.text) for f in heldout] + list(references), cfg)
    return CorpusSplit(kept, heldout, held_projects, absent, why, dropped, len(references), cfg.threshold)


def _exact_key(text: str) -> str:
    """Equal for texts equal up to comments and layout. A text that normalises to nothing (a header of
    preprocessor lines only, which ``normalize_code`` reads as Python comments) is compared by its words."""
    normal = normalize_code(text) or " ".join(text.split())
    return hashlib.sha256(normal.encode()).hexdigest()


def _drop_duplicates(
    train: Sequence[CuFile], protected: Sequence[tuple[str, str]], cfg: SplitConfig
) -> tuple[list[CuFile], list[Duplicate]]:
    index = MinHashIndex(cfg.threshold)
    exact: dict[str, str] = {}
    for key, text in protected:
        exact.setdefault(_exact_key(text), key)
        index.add(key, text)
    seen: dict[str, str] = {}  # exact key -> the kept training file
    kept: list[CuFile] = []
    dropped: list[Duplicate] = []
    for f in train:
        key = _exact_key(f.text)
        if key in exact:
            dropped.append(Duplicate(f.id, "exact", exact[key], 1.0))
            continue
        near = index.query(f.text)
        if near:
            dropped.append(Duplicate(f.id, "near", near[0][0], round(near[0][1], 4)))
            continue
        if key in seen:
            dropped.append(Duplicate(f.id, "exact-in-train", seen[key], 1.0))
            continue
        seen[key] = f.id
        kept.append(f)
    return kept, dropped


__all__ = [
    "DEFAULT_FILE_FRACTION",
    "DEFAULT_HOLDOUT_PROJECTS",
    "DEFAULT_THRESHOLD",
    "REFERENCE_SUFFIXES",
    "CorpusSplit",
    "Duplicate",
    "SplitConfig",
    "heldout_projects",
    "read_corpus",
    "read_reference_tree",
    "split_corpus",
    "unit_hash",
]
