"""SFT corpus: sources -> chat examples -> held-out split by problem -> token ids -> packed rows.

- :mod:`~training.corpus.sources`: reading ``../shared/data`` (KernelBench PR-67 / DeepSeek-R1 answers,
  CUDA-L1, KernelBench) into :class:`Solution` records.
- :mod:`~training.corpus.cuts`: the CUDA source strings of a program and the infill holes cut from them
  (a statement, a few statements, a loop body, a whole kernel body).
- :mod:`~training.corpus.render`: chat examples rendered with the engine's templates: DICE whole-program,
  DICE-style infilling (the program around the CUDA source string is shown, the whole program is the
  answer) and ``.cu`` infilling.
- :mod:`~training.corpus.build`: the held-out split by problem and the files of ``dice train corpus``.
- :mod:`~training.corpus.examples`: :class:`Example` and its ``.jsonl(.gz)`` files.
- :mod:`~training.corpus.packing`: token ids and block-aligned packed rows (:class:`PackedRows`).
"""

from training.corpus.build import (
    PR67_EVAL_PROBLEMS,
    CorpusConfig,
    CorpusWriter,
    KernelBenchPart,
    build_corpus,
    build_examples,
    kernelbench_part,
    split_groups,
)
from training.corpus.cuts import INFILL_KINDS, CudaString, InfillCut, cuda_strings, infill_cuts
from training.corpus.examples import TASKS, Example, read_code_texts, read_examples
from training.corpus.packing import (
    ChatSpecials,
    PackedRows,
    chat_sequence,
    code_sequences,
    encode_example,
    pack,
    tokenize_and_pack,
)
from training.corpus.render import render_cu_infill, render_dice_infill, render_kernelbench
from training.corpus.sources import Solution, problem_key, read_all, read_cuda_l1, read_kernelbench, read_pr67

__all__ = [
    "INFILL_KINDS",
    "PR67_EVAL_PROBLEMS",
    "TASKS",
    "ChatSpecials",
    "CorpusConfig",
    "CorpusWriter",
    "CudaString",
    "Example",
    "InfillCut",
    "KernelBenchPart",
    "PackedRows",
    "Solution",
    "build_corpus",
    "build_examples",
    "chat_sequence",
    "code_sequences",
    "cuda_strings",
    "encode_example",
    "infill_cuts",
    "kernelbench_part",
    "pack",
    "problem_key",
    "read_all",
    "read_code_texts",
    "read_cuda_l1",
    "read_examples",
    "read_kernelbench",
    "read_pr67",
    "render_cu_infill",
    "render_dice_infill",
    "render_kernelbench",
    "split_groups",
    "tokenize_and_pack",
]
