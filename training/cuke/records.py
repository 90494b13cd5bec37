"""CuKe's records: what every reader yields and every later stage passes on.

- :class:`Pair`: a PyTorch reference and (usually) a candidate CUDA program solving it, KernelBench form
  (``class Model`` / ``get_inputs`` / ``get_init_inputs`` in the reference, ``class ModelNew`` with its
  kernels, typically through ``torch.utils.cpp_extension.load_inline``, in the candidate).
- :class:`CuFile`: one raw CUDA source file of a corpus (the editor's ``.cu`` tasks come from these).
- :class:`ReadError`: a source that cannot be read, naming the file and the record.

A pair's ``problem`` is the KernelBench problem key ``"L{level}P{id}"`` when the source says which problem it
solves, and ``kb_version`` which release of KernelBench that key refers to: ``"v0"`` (the PR-67 and CUDA-L1
releases solve the v0 problems, whose references are in their records), ``"current"`` (today's
``problems.jsonl``) or None (unknown). The split's unit is the key alone: v0 ``L1P19`` and current
``L1P19`` are the same operator at other sizes, so a held-out key is held out in both versions.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

KB_VERSIONS = ("v0", "current")


class ReadError(ValueError):
    """A source that does not match its format: ``str()`` names the file, the record and what is wrong."""

    def __init__(self, path: str, where: str | None, reason: str) -> None:
        self.path, self.where, self.reason = str(path), where, reason
        super().__init__(f"{self.path}{f' ({where})' if where else ''}: {reason}")


@dataclass
class Pair:
    id: str  # unique within a build: "<source tag>:<record index or the source's own id>"
    source: str  # where it came from: a data folder name or a file name (as the report groups them)
    pytorch_code: str
    cuda_code: str | None  # None: a reference with no candidate (problems files, augmentation inputs)
    problem: str | None = None  # "L{level}P{id}" when known
    kb_version: str | None = None  # "v0" | "current" | None
    level: int | None = None  # the level the source declares (1 single op, 2 fused ops, 3 whole model)
    name: str | None = None  # KernelBench problem name when known ("19_ReLU.py")
    meta: dict[str, Any] = field(default_factory=dict)  # source-specific (claimed speedup, GPU, ...)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def problem_ref(self) -> str | None:
        """The split unit: "v0:L1P19", "current:L2P5" (None when the problem is unknown)."""
        if self.problem is None:
            return None
        return f"{self.kb_version or 'unknown'}:{self.problem}"


@dataclass
class CuFile:
    id: str  # "<repo>:<path>"
    repo: str  # "owner/name"
    path: str
    text: str
    license: str | None = None
    commit: str | None = None
    source: str = "cuda-corpus"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def content_hash(*parts: str | None) -> str:
    """A stable short hash of texts (cache keys, ids)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(b"\x00" if p is None else p.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()[:24]


__all__ = ["KB_VERSIONS", "CuFile", "Pair", "ReadError", "content_hash"]
