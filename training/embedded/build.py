"""``dice train corpus``: the KernelBench examples (``training.corpus``, split by problem) and the real-code
corpus (split by project and file, deduplicated against the held-out side, cut into ``.cu`` infill holes),
written as one corpus.

Files in the output folder: ``train.jsonl.gz``, ``heldout.jsonl.gz`` (the held-out side's examples, for a
held-out loss), ``tokenizer_text.txt`` (training-split text only: no held-out problem or file ever reaches
the tokenizer), ``corpus_stats.json``, ``split.json`` (held-out projects and files, duplicates dropped) and
``sources.md`` (the projects trained on, for the model card).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from training.corpus.build import CorpusConfig, CorpusWriter, kernelbench_part
from training.cuke.records import CuFile
from training.embedded.holes import FileExamples, HoleConfig, file_examples
from training.embedded.split import CorpusSplit, SplitConfig, read_corpus, read_reference_tree, split_corpus

_MAX_WORKERS = 8


@dataclass
class EmbeddedConfig:
    """One corpus build. ``cuda_corpus`` None: KernelBench only (the old corpus); ``kernelbench`` False:
    the real-code corpus only. ``reference_trees``: folders (realproj) no training file may duplicate.
    ``split.seed`` and ``holes.seed`` are replaced by ``seed``."""

    out_dir: Path
    data_dir: Path | None = None
    seed: int = 0
    kernelbench: bool = True
    heldout_fraction: float = 0.08  # of KernelBench problems
    cu_variants: int = 12  # KernelBench .cu infill examples per CUDA source
    cuda_corpus: Path | None = None
    reference_trees: tuple[Path, ...] = ()
    split: SplitConfig = field(default_factory=SplitConfig)
    holes: HoleConfig = field(default_factory=HoleConfig)
    workers: int = 0  # processes cutting holes; 0: one per CPU (at most 8), 1: this process

    def validate(self) -> None:
        if not self.kernelbench and self.cuda_corpus is None:
            raise ValueError("nothing to build: KernelBench is off and no real-code corpus is given")
        if self.kernelbench and self.data_dir is None:
            raise ValueError("KernelBench examples need the data folder")
        replace(self.split, seed=self.seed).validate()
        self.holes.validate()


def build_embedded_corpus(cfg: EmbeddedConfig) -> dict[str, Any]:
    """Build the corpus into ``cfg.out_dir``; returns what ``corpus_stats.json`` holds."""
    cfg.validate()
    started = time.perf_counter()
    stats: dict[str, Any] = {}
    with CorpusWriter(cfg.out_dir) as out:
        if cfg.kernelbench:
            assert cfg.data_dir is not None
            kb_cfg = CorpusConfig(cfg.data_dir, cfg.out_dir, cfg.seed, cfg.heldout_fraction, cfg.cu_variants)
            part = kernelbench_part(kb_cfg)
            for ex in part.examples:
                out.example(ex, part.split_of(ex))
            for text in part.tokenizer_texts:
                out.tokenizer_text(text)
            stats["heldout_groups"] = sorted(part.heldout_groups)
            stats["problems"] = {"total": part.problems, "heldout": len(part.heldout_groups)}
        split = None
        if cfg.cuda_corpus is not None:
            split, real = _real_code(cfg, out)
            stats["cuda_corpus"] = real
    stats = {**out.counts, **stats}
    if split is not None:
        (cfg.out_dir / "split.json").write_text(json.dumps(split.to_json(), indent=2) + "\n")
        write_split_files(split, cfg.out_dir)
    sources = sources_table(split, stats.get("cuda_corpus", {}).get("per_project", {}))
    (cfg.out_dir / "sources.md").write_text(sources, encoding="utf-8")
    stats["seconds"] = round(time.perf_counter() - started, 1)
    (cfg.out_dir / "corpus_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def write_split_files(split: CorpusSplit, out_dir: Path) -> None:
    """``train_files.jsonl.gz`` and ``heldout_files.jsonl.gz``: each side's files in the cuda-corpus schema,
    so later stages that read files (``dice cuke build --source``: BiC-RL's ``.cu`` tasks and their held-out
    evaluation tasks) stay on the same side of this split."""
    import gzip

    for name, files in (("train_files", split.train), ("heldout_files", split.heldout)):
        # mtime 0: the same split gives the same bytes
        with gzip.GzipFile(out_dir / f"{name}.jsonl.gz", "wb", mtime=0) as raw:
            for f in files:
                raw.write((json.dumps(f.to_json(), ensure_ascii=False) + "\n").encode("utf-8"))


def _real_code(cfg: EmbeddedConfig, out: CorpusWriter) -> tuple[CorpusSplit, dict[str, Any]]:
    """Read, split and deduplicate the real-code corpus, write its examples and training text; its stats."""
    assert cfg.cuda_corpus is not None
    t0 = time.perf_counter()
    files = read_corpus(cfg.cuda_corpus)
    references = [item for tree in cfg.reference_trees for item in read_reference_tree(tree)]
    split = split_corpus(files, replace(cfg.split, seed=cfg.seed), references)
    t_split = time.perf_counter() - t0
    for f in split.train:
        out.tokenizer_text(f.text)
    holes = replace(cfg.holes, seed=cfg.seed)
    items = [(f, "train") for f in split.train] + [(f, "heldout") for f in split.heldout]
    by_kind: dict[str, Counter] = {"train": Counter(), "heldout": Counter()}
    per_project: dict[str, Counter] = {}
    skipped: Counter = Counter()
    empty_prefix = 0
    for (f, side), result in _cut_files(items, holes, cfg.workers):
        for ex in result.examples:
            out.example(ex, side)
            by_kind[side][ex.meta["kind"] if ex.meta else "?"] += 1
        per_project.setdefault(f.repo, Counter())[f"{side}_examples"] += len(result.examples)
        if result.skipped:
            skipped[result.skipped] += 1
        empty_prefix += result.empty_prefix
    for f in split.train:
        per_project.setdefault(f.repo, Counter())["train_files"] += 1
    for f in split.heldout:
        per_project.setdefault(f.repo, Counter())["heldout_files"] += 1
    repo_of = {f.id: f.repo for f in files}
    for d in split.dropped:
        per_project.setdefault(repo_of[d.id], Counter())["dropped_files"] += 1
    stats = {
        "path": str(cfg.cuda_corpus),
        "reference_trees": [str(p) for p in cfg.reference_trees],
        "split": split.counts(),
        "heldout_projects": split.heldout_projects,
        "absent_projects": split.absent_projects,
        "dropped_as_duplicate": [asdict(d) for d in split.dropped],
        "examples": {side: dict(sorted(c.items())) for side, c in by_kind.items()},
        "skipped_files": dict(sorted(skipped.items())),
        "empty_prefix_holes": empty_prefix,
        "settings": {
            "split": asdict(replace(cfg.split, seed=cfg.seed)),
            "holes": {**asdict(holes), "weights": dict(holes.weights)},
        },
        "per_project": {repo: _project_row(repo, files, c) for repo, c in sorted(per_project.items())},
        "seconds": {"read_split_dedup": round(t_split, 1), "total": round(time.perf_counter() - t0, 1)},
    }
    return split, stats


def _project_row(repo: str, files: Sequence[CuFile], counts: Counter) -> dict[str, Any]:
    first = next(f for f in files if f.repo == repo)
    return {"commit": first.commit, "license": first.license, **{k: counts.get(k, 0) for k in _COUNTS}}


_COUNTS = ("train_files", "heldout_files", "dropped_files", "train_examples", "heldout_examples")


def _cut_files(
    items: list[tuple[CuFile, str]], cfg: HoleConfig, workers: int
) -> Iterator[tuple[tuple[CuFile, str], FileExamples]]:
    """``file_examples`` of every item, in item order; over ``workers`` processes (spawned: the parser's
    state is never shared with a fork) when there is enough to cut."""
    cut = functools.partial(file_examples, cfg=cfg)
    workers = workers or min(os.cpu_count() or 1, _MAX_WORKERS)
    if workers <= 1 or len(items) < 32:
        for item in items:
            yield item, cut(item)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from zip(items, pool.map(cut, items, chunksize=8), strict=True)


def sources_table(split: CorpusSplit | None, per_project: dict[str, dict[str, Any]]) -> str:
    """``sources.md``: the real-code projects of the build (trained on, or held out whole), for the model
    card."""
    if split is None:
        return "# Real-code sources\n\nNo real-code corpus in this build (KernelBench sources only).\n"
    held = set(split.heldout_projects)
    lines = [
        "# Real-code sources",
        "",
        "Real CUDA files of the `cuda-corpus` (each project's licence text is in that folder as "
        "`LICENSE-<owner>+<repo>`). Held-out projects are never trained on; of the other projects a seeded "
        "fraction of files is held out, and training files that duplicate a held-out or reference file "
        "(exactly or near, normalised text, Jaccard >= "
        f"{split.threshold}) are dropped.",
        "",
        "| repository | commit | licence | files trained on | files held out | dropped as duplicates "
        "| train examples | held-out examples |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    totals = Counter()
    for repo, row in per_project.items():
        name = f"{repo} (held-out project)" if repo in held else repo
        commit = f"`{row['commit']}`" if row.get("commit") else ""
        lines.append(
            f"| {name} | {commit} | {row.get('license') or ''} | "
            + " | ".join(f"{row[k]:,}" for k in _COUNTS)
            + " |"
        )
        totals.update({k: row[k] for k in _COUNTS})
    lines.append("| **total** | | | " + " | ".join(f"**{totals[k]:,}**" for k in _COUNTS) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["EmbeddedConfig", "build_embedded_corpus", "sources_table"]
