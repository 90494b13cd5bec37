"""The embedded model's corpus: real CUDA code beside the KernelBench examples (``dice train corpus``).

- :mod:`~training.embedded.split`: the held-out split of the real-code corpus by project and by file, made
  before anything is trained, and the training files that duplicate a held-out or reference file dropped.
- :mod:`~training.embedded.holes`: ``.cu`` infill examples cut from real files (statements, expressions,
  runs, loop bodies, function bodies), line-aligned and windowed exactly as the editor prompts.
- :mod:`~training.embedded.build`: the whole corpus build (KernelBench via ``training.corpus`` + real code),
  its files, ``split.json`` and ``sources.md``.

``training.corpus`` never imports this package (the import-linter contracts forbid sibling cycles).
"""

from training.embedded.build import EmbeddedConfig, build_embedded_corpus, sources_table
from training.embedded.holes import (
    HOLE_KINDS,
    KIND_WEIGHTS,
    FileExamples,
    Hole,
    HoleConfig,
    candidate_holes,
    file_examples,
    pick_holes,
    window,
)
from training.embedded.split import (
    DEFAULT_HOLDOUT_PROJECTS,
    CorpusSplit,
    Duplicate,
    SplitConfig,
    heldout_projects,
    read_corpus,
    read_reference_tree,
    split_corpus,
)

__all__ = [
    "DEFAULT_HOLDOUT_PROJECTS",
    "HOLE_KINDS",
    "KIND_WEIGHTS",
    "CorpusSplit",
    "Duplicate",
    "EmbeddedConfig",
    "FileExamples",
    "Hole",
    "HoleConfig",
    "SplitConfig",
    "build_embedded_corpus",
    "candidate_holes",
    "file_examples",
    "heldout_projects",
    "pick_holes",
    "read_corpus",
    "read_reference_tree",
    "sources_table",
    "split_corpus",
    "window",
]
