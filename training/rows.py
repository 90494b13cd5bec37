"""The packed rows as a dataset: loading them (or tokenising and packing examples), and the sampler whose
order depends on (seed, epoch) alone."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor


class EpochPermutation(torch.utils.data.Sampler):
    """A fresh permutation per epoch from (seed, epoch) alone: the same order on any process count and
    after a resume (accelerate shards the batches of this one order over processes)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=gen).tolist())


class RowDataset(torch.utils.data.Dataset):
    def __init__(self, rows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        r = self.rows
        return {
            "input_ids": r.input_ids[i],
            "position_ids": r.position_ids[i],
            "doc_ids": r.doc_ids[i],
            "loss_mask": r.loss_mask[i],
            "row_index": torch.tensor(i),
        }


def load_rows(path: str, tokenizer, seq_len: int, block_size: int):
    """Packed rows from a .safetensors file, or tokenised and packed from a .jsonl of examples."""
    from training.corpus import PackedRows, read_examples, tokenize_and_pack

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: data file not found")
    if p.suffix in (".safetensors", ".npz"):
        rows = PackedRows.load(p)
        stats = {"rows": len(rows), "answer_tokens": int(rows.loss_mask.sum())}
    else:
        rows, stats = tokenize_and_pack(read_examples(p), tokenizer, seq_len=seq_len, block_size=block_size)
    if len(rows) == 0:
        raise ValueError(f"{p}: no rows (every example longer than --seq-len {seq_len}?)")
    if rows.input_ids.shape[1] % block_size:
        raise ValueError(
            f"{p}: row length {rows.input_ids.shape[1]} is not a multiple of block size {block_size}"
        )
    return rows, stats
