"""Exact and near duplicates within a pair set, and contamination against the evaluation problems.

Every pair in the shared data solves a KernelBench problem, so two questions decide what a build may keep
and what it may report on:

- **Duplicates** (:func:`dedup_pairs`): the same candidate for the same problem, reformatted, re-commented
  or with a renamed variable, would weigh one solution several times in SFT. A pair duplicates a kept one
  when its candidate is an exact or near duplicate *and* its reference is the same problem; of the two, the
  faster (``meta["speedup"]``, what the builder measured) is kept, else the first.
- **Contamination** (:func:`contamination`): which evaluation problems (KernelBench levels 1-3, both the
  v0 references of the PR-67 / CUDA-L1 records and the current ``problems.jsonl``) a pair's reference
  overlaps: the same normalised text, a near duplicate, or the same problem key. The split
  (``training.cuke.split``) holds such pairs out with their problem.

Text is compared after :func:`normalize_code` (comments, docstrings and layout gone), near duplicates by
MinHash over word 5-shingles with datasketch's LSH (candidates) and the exact Jaccard of the shingle sets
(the decision), so the result does not depend on MinHash's estimation noise.
"""

from __future__ import annotations

import ast
import functools
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from datasketch import MinHash, MinHashLSH

from training.cuke.records import Pair, content_hash

NUM_PERM = 128
SHINGLE = 5
DEFAULT_THRESHOLD = 0.85
# LSH is probabilistic: it proposes candidates well below the threshold so that pairs just above it are not
# missed (at 0.65 datasketch bands 128 permutations as 16 x 8: a pair at Jaccard 0.85 is a candidate with
# probability 1 - (1 - 0.85**8)**16 = 99.4 %, against 87 % at 0.85 itself); the exact Jaccard decides.
_LSH_SLACK = 0.2
EVAL_LEVELS = (1, 2, 3)

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\S")
# C/C++ comments, skipping string and character literals (a "//" inside "http://..." is not a comment).
_C_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
_PY_HASH_COMMENT = re.compile(r"(?m)#(?=[ \t!#]|$)[^\n]*")
_LOOKS_LIKE_C = re.compile(r"[;{}]|//|/\*|#include|__global__")


def _strip_c_comments(text: str) -> str:
    return _C_COMMENT.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), text)


_STRINGS = (ast.Constant, ast.JoinedStr)


def _strip_python(tree: ast.Module) -> ast.Module:
    """Drops docstrings and bare string statements, strips C comments inside source-like strings (in place:
    ``ast.walk`` is several times cheaper than a NodeTransformer on thousands of programs)."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, _STRINGS))]
                setattr(node, name, kept or [ast.Pass()])
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and _LOOKS_LIKE_C.search(text):
            node.value = " ".join(_strip_c_comments(node.value).split())
    return tree


def _normalise_uncached(text: str) -> str:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        # Not Python (a .cu file, a truncated answer): C comments and "# " comments go, directives stay.
        code = _PY_HASH_COMMENT.sub(" ", _strip_c_comments(text))
    else:
        code = ast.unparse(_strip_python(tree))
    return " ".join(_TOKEN.findall(code))


@functools.lru_cache(maxsize=16384)
def normalize_code(text: str) -> str:
    """The comparable form of a program: Python comments and docstrings, C/C++ comments (also inside CUDA
    source strings embedded in Python) and all layout dropped, tokens joined by single spaces.

    Stable: the same program reformatted (black, another indent, calls split over lines) or re-commented
    gives the same string, so exact duplicates are found by equality. Cached: dedup and contamination
    normalise every reference several times.
    """
    return _normalise_uncached(text)


def exact_key(pair: Pair) -> str:
    """Equal for two pairs exactly when their normalised reference and candidate are equal."""
    cuda = None if pair.cuda_code is None else normalize_code(pair.cuda_code)
    return content_hash(normalize_code(pair.pytorch_code), cuda)


def shingles(normalised: str) -> set[int]:
    """Word 5-shingles of a normalised text, each as its CRC-32 (a text shorter than five tokens is one
    shingle). Integers, not the shingles' text: half the memory in the caches, and MinHash takes them as
    they are; a collision among a program's few thousand shingles is a 1e-4 event that moves Jaccard by
    less than 0.001."""
    tokens = normalised.split(" ") if normalised else []
    if not tokens:
        return set()
    if len(tokens) < SHINGLE:
        return {zlib.crc32(" ".join(tokens).encode())}
    return {zlib.crc32(" ".join(tokens[i : i + SHINGLE]).encode()) for i in range(len(tokens) - SHINGLE + 1)}


def jaccard(a: frozenset[int] | set[int], b: frozenset[int] | set[int]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class MinHashIndex:
    """Near-duplicate lookup over normalised code: datasketch MinHash (128 permutations, fixed seed) of word
    5-shingles in a MinHashLSH, each LSH candidate confirmed by its exact shingle Jaccard >= threshold."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, num_perm: int = NUM_PERM) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold, self.num_perm = threshold, num_perm
        self._lsh = MinHashLSH(threshold=max(0.05, threshold - _LSH_SLACK), num_perm=num_perm)
        self._shingles: dict[str, frozenset[int]] = {}

    def __len__(self) -> int:
        return len(self._shingles)

    def __contains__(self, key: object) -> bool:
        return key in self._shingles

    def _sketch(self, text: str) -> tuple[frozenset[int], MinHash]:
        return _shingles_of(text), _minhash_of(text, self.num_perm)

    def add(self, key: str, text: str) -> None:
        """Index ``text`` (raw code: it is normalised here) under ``key``; a key already there is replaced."""
        if key in self._shingles:
            self.remove(key)
        sh, mh = self._sketch(text)
        self._shingles[key] = sh
        if sh:
            self._lsh.insert(key, mh)

    def remove(self, key: str) -> None:
        if self._shingles.pop(key, None):
            self._lsh.remove(key)

    def query(self, text: str) -> list[tuple[str, float]]:
        """Keys whose code is a near duplicate of ``text`` (Jaccard >= threshold), most similar first."""
        sh, mh = self._sketch(text)
        if not sh:
            return []
        found = [(key, jaccard(sh, self._shingles[key])) for key in self._lsh.query(mh)]
        return sorted(((k, s) for k, s in found if s >= self.threshold), key=lambda ks: (-ks[1], ks[0]))

    def similarity(self, key: str, text: str) -> float:
        return jaccard(_shingles_of(text), self._shingles[key])


@functools.lru_cache(maxsize=8192)
def _shingles_of(text: str) -> frozenset[int]:
    return frozenset(shingles(normalize_code(text)))


def _identity(value: int) -> int:
    return value


@functools.lru_cache(maxsize=4)
def _permutations(num_perm: int) -> dict[str, Any]:
    """datasketch's permutations for ``num_perm`` (its fixed seed), computed once instead of per sketch
    (datasketch 2 also wants their ``scheme`` said; 1.x has none)."""
    first = MinHash(num_perm=num_perm)
    kwargs: dict[str, Any] = {"permutations": first.permutations}
    if hasattr(first, "scheme"):
        kwargs["scheme"] = first.scheme
    return kwargs


@functools.lru_cache(maxsize=8192)
def _minhash_of(text: str, num_perm: int) -> MinHash:
    """The MinHash of a text's shingles (already 32-bit hashes: taken as they are); never mutated.
    Deterministic: datasketch's fixed permutation seed, shared by every sketch."""
    mh = MinHash(num_perm=num_perm, hashfunc=_identity, **_permutations(num_perm))
    mh.update_batch(sorted(_shingles_of(text)))
    return mh


# ------------------------------------------------------------------------------------------------ dedup
@dataclass
class Dropped:
    pair_id: str
    reason: str  # "exact" | "near"
    duplicate_of: str  # the id of the kept pair
    similarity: float  # the candidates' Jaccard (the references' for reference-only pairs); 1.0 for exact


@dataclass
class DedupResult:
    kept: list[Pair]
    dropped: list[Dropped] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kept": len(self.kept), "dropped": [d.__dict__ for d in self.dropped]}


def _speedup(pair: Pair) -> float | None:
    value = pair.meta.get("speedup")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return float(value) if ok else None


def _posed(pair: Pair) -> tuple:
    """The sizes a pair's problem is posed at, where augmentation chose them (None elsewhere)."""
    m = pair.meta
    return (m.get("variant"), m.get("block"), m.get("model"), m.get("batch"), m.get("seq_len"))


def _same_problem(a: Pair, b: Pair, threshold: float) -> bool:
    """The references pose the same problem. Known keys decide when both have one: the same key is the same
    problem (in either version: the same operator at other sizes), two keys of one version are two problems
    (KernelBench made them distinct, even where only sizes differ). Else the references' text decides:
    exact or near-equal (Jaccard >= threshold). A shape variant (augmentation) poses its problem at other
    sizes: it is the same problem only as a variant of the same sizes, so a kernel's variants are not
    duplicates of it or of each other (DICE keeps one sample per shape), while two near-equal kernels'
    variants at one size are. Layer-block references (``training.cuke.blocks``) of other shapes or models
    are other problems in the same way."""
    if _posed(a) != _posed(b):
        return False
    if a.problem and b.problem and a.kb_version and b.kb_version:
        if a.problem == b.problem:
            return True
        if a.kb_version == b.kb_version:
            return False
    return jaccard(_shingles_of(a.pytorch_code), _shingles_of(b.pytorch_code)) >= threshold


def dedup_pairs(pairs: Sequence[Pair], *, threshold: float = DEFAULT_THRESHOLD) -> DedupResult:
    """Drop pairs whose candidate is an exact or near duplicate of a kept pair's candidate for the same
    problem (reference-only pairs: whose reference duplicates a kept reference). Of two duplicates the
    faster is kept when both carry ``meta["speedup"]``, else the first; a replaced keeper's duplicates then
    point at the new keeper. ``kept`` keeps the input order."""
    by_id = {p.id: p for p in pairs}
    if len(by_id) != len(pairs):
        raise ValueError("dedup_pairs: pair ids must be unique within a build")
    index = {"cand": MinHashIndex(threshold), "ref": MinHashIndex(threshold)}
    exact: dict[str, str] = {}  # exact key -> kept id
    kept: dict[str, Pair] = {}
    dropped: dict[str, Dropped] = {}
    for pair in pairs:
        kind = "ref" if pair.cuda_code is None else "cand"
        text = pair.pytorch_code if kind == "ref" else pair.cuda_code
        assert text is not None
        key = exact_key(pair)
        if key in exact:
            hit: tuple[str, str, float] | None = (exact[key], "exact", 1.0)
        else:
            hit = None
            for other_id, sim in index[kind].query(text):
                if _same_problem(pair, kept[other_id], threshold):
                    hit = (other_id, "near", sim)
                    break
        if hit is None:
            kept[pair.id], exact[key] = pair, pair.id
            index[kind].add(pair.id, text)
            continue
        other_id, reason, sim = hit
        other = kept[other_id]
        mine, theirs = _speedup(pair), _speedup(other)
        if mine is not None and theirs is not None and mine > theirs:
            _replace_keeper(other, pair, text, index[kind], exact, kept, dropped, (reason, sim))
        else:
            dropped[pair.id] = Dropped(pair.id, reason, other_id, round(sim, 4))
    order = {p.id: i for i, p in enumerate(pairs)}
    return DedupResult(
        kept=sorted(kept.values(), key=lambda p: order[p.id]),
        dropped=sorted(dropped.values(), key=lambda d: order[d.pair_id]),
    )


def _replace_keeper(
    old: Pair,
    new: Pair,
    text: str,
    index: MinHashIndex,
    exact: dict[str, str],
    kept: dict[str, Pair],
    dropped: dict[str, Dropped],
    why: tuple[str, float],
) -> None:
    """``new`` (faster) takes ``old``'s place: old is dropped as its duplicate, old's duplicates follow."""
    del kept[old.id]
    index.remove(old.id)
    for key, kid in list(exact.items()):
        if kid == old.id:
            exact[key] = new.id
    kept[new.id] = new
    exact[exact_key(new)] = new.id
    index.add(new.id, text)
    dropped[old.id] = Dropped(old.id, why[0], new.id, round(why[1], 4))
    for d in dropped.values():
        if d.duplicate_of == old.id:
            d.duplicate_of = new.id


# ---------------------------------------------------------------------------------------- contamination
@dataclass(frozen=True)
class Match:
    eval_ref: str  # the evaluation problem's problem_ref: "v0:L1P19", "current:L2P5"
    kind: str  # "exact" | "near" | "key" (strongest first)
    similarity: float  # Jaccard of the normalised references' shingles


_KEY = re.compile(r"L(\d+)P(\d+)")


def key_level(problem: str | None) -> int | None:
    """``"L2P17"`` -> 2 (None for no key or another form)."""
    m = _KEY.fullmatch(problem or "")
    return int(m.group(1)) if m else None


def eval_problems_from(
    pairs_and_problems: Iterable[Pair], *, levels: Sequence[int] = EVAL_LEVELS
) -> list[Pair]:
    """The evaluation set: one reference per (kb_version, problem) of KernelBench levels 1-3, in first-seen
    order: the current ones from a problems file (reference-only pairs), the v0 ones from the PR-67 and
    CUDA-L1 records' own ``pytorch_code`` (v0 problems are in no problems file here)."""
    seen: dict[str, Pair] = {}
    for p in pairs_and_problems:
        ref = p.problem_ref
        if ref is None or p.kb_version is None or ref in seen or key_level(p.problem) not in levels:
            continue
        seen[ref] = Pair(
            id=f"eval:{ref}",
            source=f"kernelbench-{p.kb_version}",
            pytorch_code=p.pytorch_code,
            cuda_code=None,
            problem=p.problem,
            kb_version=p.kb_version,
            level=key_level(p.problem),
            name=p.name,
        )
    return list(seen.values())


_KIND_RANK = {"exact": 0, "near": 1, "key": 2}


def contamination(
    pairs: Iterable[Pair], eval_problems: Sequence[Pair], *, threshold: float = DEFAULT_THRESHOLD
) -> dict[str, list[Match]]:
    """For every pair (an empty list when none), the evaluation problems its reference overlaps: the same
    normalised text ("exact"), a near duplicate ("near", Jaccard >= threshold) or the same problem key in
    either version ("key": v0 and current ``L1P19`` are one operator at other sizes). One match per
    evaluation problem, the strongest kind, sorted by kind then similarity."""
    index = MinHashIndex(threshold)
    by_norm: dict[str, list[str]] = {}
    by_key: dict[str, list[str]] = {}
    for e in eval_problems:
        ref = e.problem_ref or e.id
        index.add(ref, e.pytorch_code)
        by_norm.setdefault(normalize_code(e.pytorch_code), []).append(ref)
        if e.problem:
            by_key.setdefault(e.problem, []).append(ref)
    out: dict[str, list[Match]] = {}
    for pair in pairs:
        found: dict[str, Match] = {}
        for ref in by_norm.get(normalize_code(pair.pytorch_code), []):
            found[ref] = Match(ref, "exact", 1.0)
        for ref, sim in index.query(pair.pytorch_code):
            found.setdefault(ref, Match(ref, "near", round(sim, 4)))
        for ref in by_key.get(pair.problem or "", []):
            if ref not in found:
                found[ref] = Match(ref, "key", round(index.similarity(ref, pair.pytorch_code), 4))
        out[pair.id] = sorted(found.values(), key=lambda m: (_KIND_RANK[m.kind], -m.similarity, m.eval_ref))
    return out


def _pair_level(pair: Pair) -> int | None:
    return pair.level if pair.level is not None else key_level(pair.problem)


def contamination_table(
    pairs: Sequence[Pair], matches: dict[str, list[Match]], eval_problems: Sequence[Pair]
) -> list[dict[str, Any]]:
    """Rows per (source, eval version, level of the pair) for the report: ``pairs`` of that source and level,
    ``overlapping`` (pairs matching at least one problem of that version), ``exact`` / ``near`` / ``key``
    (pairs whose strongest match of that version is of that kind), ``problems_hit`` (distinct problems of
    that version hit) out of ``eval_problems`` (that version's problems at that level)."""
    versions = sorted({e.kb_version or "unknown" for e in eval_problems})
    per_level: dict[tuple[str, int | None], int] = {}
    for e in eval_problems:
        k = (e.kb_version or "unknown", _pair_level(e))
        per_level[k] = per_level.get(k, 0) + 1
    groups: dict[tuple[str, int | None], list[Pair]] = {}
    for p in pairs:
        groups.setdefault((p.source, _pair_level(p)), []).append(p)
    rows = []
    for (source, level), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 99)):
        for version in versions:
            row: dict[str, Any] = {"source": source, "eval_version": version, "level": level}
            row.update(pairs=len(members), overlapping=0, exact=0, near=0, key=0)
            hit: set[str] = set()
            for p in members:
                mine = [m for m in matches.get(p.id, []) if m.eval_ref.split(":", 1)[0] == version]
                if mine:
                    row["overlapping"] += 1
                    row[mine[0].kind] += 1
                    hit.update(m.eval_ref for m in mine)
            row["problems_hit"] = len(hit)
            row["eval_problems"] = per_level.get((version, level), 0)
            rows.append(row)
    return rows


__all__ = [
    "DEFAULT_THRESHOLD",
    "DedupResult",
    "Dropped",
    "Match",
    "MinHashIndex",
    "contamination",
    "contamination_table",
    "dedup_pairs",
    "eval_problems_from",
    "exact_key",
    "jaccard",
    "key_level",
    "normalize_code",
    "shingles",
]
