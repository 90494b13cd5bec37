"""The corpus: solutions -> chat examples, the held-out split by problem, and the files ``dice train corpus``
writes.

Every example belongs to a *problem* (``L{level}P{id}``); the held-out split is drawn over problems before
anything is trained, so no held-out problem's code reaches the tokenizer or the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from training.corpus.cuts import CudaString, InfillCut, cuda_strings, infill_cuts
from training.corpus.examples import Example, open_text
from training.corpus.render import render_cu_infill, render_dice_infill, render_kernelbench
from training.corpus.sources import Solution, read_all

# KernelBench PR 67 "eval" problems (SOURCE.md): always held out, so the split also keeps their choice.
PR67_EVAL_PROBLEMS = {
    1: {7, 10, 14, 26, 29, 34, 38, 56, 64, 74},
    2: {3, 7, 17, 19, 30, 55, 58, 59, 67, 81},
}


def split_groups(groups: Iterable[str], heldout_fraction: float, seed: int) -> set[str]:
    """The held-out problems: PR-67's eval problems plus a seeded hash-chosen fraction of the others."""
    held = set()
    for g in sorted(set(groups)):
        level, pid = (int(x) for x in g[1:].split("P"))
        h = int(hashlib.sha256(f"{seed}:{g}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if pid in PR67_EVAL_PROBLEMS.get(level, set()) or h < heldout_fraction:
            held.add(g)
    return held


@dataclass
class CorpusConfig:
    data_dir: Path
    out_dir: Path
    seed: int = 0
    heldout_fraction: float = 0.08
    cu_variants: int = 12  # .cu infill examples per distinct CUDA source
    max_middle_chars: int = 1600


def build_examples(solutions: Sequence[Solution], cfg: CorpusConfig) -> list[Example]:
    """Whole-program and DICE-infill examples of each distinct program, ``.cu`` infill examples of each
    distinct CUDA source string, and whole-program examples of current references solved in v0."""
    rng = random.Random(cfg.seed)
    examples: list[Example] = []
    seen_programs: set[str] = set()
    seen_cuda: set[str] = set()
    with_solution = {s.group for s in solutions if s.program}
    for n, sol in enumerate(solutions):
        if sol.program is None:
            if sol.source == "kernelbench" and sol.group in with_solution:
                # Current-version reference of a problem solved in v0: pair it with that problem's programs.
                twins = [s for s in solutions if s.group == sol.group and s.program][:2]
                for k, twin in enumerate(twins):
                    prompt, response = render_kernelbench(sol.ref_src, twin.program)
                    examples.append(
                        Example(f"kbmain-{n}-{k}", sol.group, "kernelbench", "kernelbench", prompt, response)
                    )
            continue
        key = hashlib.sha1(sol.program.encode()).hexdigest()
        if key in seen_programs:
            continue
        seen_programs.add(key)
        prompt, response = render_kernelbench(sol.ref_src, sol.program)
        examples.append(Example(f"kb-{key[:12]}", sol.group, "kernelbench", sol.source, prompt, response))
        strings = cuda_strings(sol.program)
        if strings:
            prompt, response = render_dice_infill(sol.ref_src, sol.program, strings[0])
            examples.append(Example(f"di-{key[:12]}", sol.group, "dice_infill", sol.source, prompt, response))
        for cs in strings:
            ckey = hashlib.sha1(cs.text.encode()).hexdigest()
            if ckey in seen_cuda:
                continue
            seen_cuda.add(ckey)
            examples.extend(_cu_infill_examples(sol, cs, ckey, cfg, rng))
    return examples


def _cu_infill_examples(
    sol: Solution, cs: CudaString, ckey: str, cfg: CorpusConfig, rng: random.Random
) -> list[Example]:
    """``cfg.cu_variants`` holes cut from one CUDA source string (none when it has no usable cut)."""
    cuts = [c for c in infill_cuts(cs.text) if 0 < c.end - c.start <= cfg.max_middle_chars]
    if not cuts:
        return []
    by_kind: dict[str, list[InfillCut]] = {}
    for c in cuts:
        by_kind.setdefault(c.kind, []).append(c)
    kinds = sorted(by_kind)
    examples = []
    for v in range(cfg.cu_variants):
        # Balance kinds: statement-level holes (the editor's main use) get half the variants.
        kind = "statement" if ("statement" in by_kind and v % 2 == 0) else rng.choice(kinds)
        cut = rng.choice(by_kind[kind])
        prefix, middle, suffix = cs.text[: cut.start], cs.text[cut.start : cut.end], cs.text[cut.end :]
        prompt, response = render_cu_infill(prefix, middle, suffix)
        meta = {"kind": kind, "prefix": prefix, "middle": middle, "suffix": suffix}
        examples.append(
            Example(
                f"cu-{ckey[:12]}-{v}", sol.group, "cu_infill", f"{sol.source}:{kind}", prompt, response, meta
            )
        )
    return examples


@dataclass
class KernelBenchPart:
    """The KernelBench side of the corpus: its examples, its held-out problems and its tokenizer text (the
    training-split references and programs)."""

    examples: list[Example]
    heldout_groups: set[str]
    tokenizer_texts: list[str]
    problems: int

    def split_of(self, ex: Example) -> str:
        return "heldout" if ex.group in self.heldout_groups else "train"


def kernelbench_part(cfg: CorpusConfig) -> KernelBenchPart:
    """Read the KernelBench sources of ``cfg.data_dir``, split them by problem and make their examples."""
    solutions = read_all(cfg.data_dir)
    held = split_groups((s.group for s in solutions), cfg.heldout_fraction, cfg.seed)
    texts: list[str] = []
    for sol in solutions:
        if sol.group in held:
            continue  # held-out problems never reach the tokenizer
        texts.append(sol.ref_src)
        if sol.program:
            texts.append(sol.program)
    return KernelBenchPart(build_examples(solutions, cfg), held, texts, len({s.group for s in solutions}))


class CorpusWriter:
    """The files of a corpus build, open while examples stream in: ``train.jsonl.gz``, ``heldout.jsonl.gz``
    (gzip: the examples repeat the prompt template and whole CUDA files, so they shrink ~40x) and
    ``tokenizer_text.txt``; ``counts`` holds examples per split and task."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.counts: dict[str, dict[str, int]] = {"train": {}, "heldout": {}}
        self._stack = contextlib.ExitStack()
        self._files = {
            split: self._stack.enter_context(open_text(out_dir / f"{split}.jsonl.gz", "wt"))
            for split in ("train", "heldout")
        }
        self._text = self._stack.enter_context(open_text(out_dir / "tokenizer_text.txt", "w"))

    def example(self, ex: Example, split: str) -> None:
        self._files[split].write(ex.to_json() + "\n")
        self.counts[split][ex.task] = self.counts[split].get(ex.task, 0) + 1

    def tokenizer_text(self, text: str) -> None:
        """Text the tokenizer is trained on: training-split code only."""
        self._text.write(text + "\n")

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> CorpusWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_corpus(cfg: CorpusConfig) -> dict:
    """Write train.jsonl.gz, heldout.jsonl.gz, tokenizer_text.txt and corpus_stats.json in ``cfg.out_dir``
    (KernelBench sources only; ``training.embedded`` adds the real-code corpus)."""
    part = kernelbench_part(cfg)
    with CorpusWriter(cfg.out_dir) as out:
        for ex in part.examples:
            out.example(ex, part.split_of(ex))
        for text in part.tokenizer_texts:
            out.tokenizer_text(text)
    stats: dict = {**out.counts, "heldout_groups": sorted(part.heldout_groups)}
    stats["problems"] = {"total": part.problems, "heldout": len(part.heldout_groups)}
    (cfg.out_dir / "corpus_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
