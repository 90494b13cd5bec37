"""SFT corpus: sources -> chat examples -> held-out split by problem -> token ids -> packed rows.

Sources (``../shared/data``, each folder's SOURCE.md gives licence and schema; all MIT):
- ``kernelbench-pr67-dsr1``: KernelBench prompt -> DeepSeek-R1 ``ModelNew`` answers (KernelBench v0, L1/L2).
- ``cuda-l1``: KernelBench v0 reference -> CUDA-L1 optimized ``ModelNew`` (H100 and A100 releases).
- ``kernelbench``: current KernelBench problems (reference code only: tokenizer text, and the whole-program
  prompt of a problem whose v0 twin has a solution).
Generated here from the CUDA source strings of those solutions: ``.cu`` infilling (a masked statement, a few
statements, a loop body, a whole kernel body) rendered with the engine's infill prompt, and DICE-style
infilling (the program around the CUDA source string is shown, the whole program is the answer).

Every example belongs to a *problem* (``L{level}P{id}``); the held-out split is drawn over problems before
anything is trained, so no held-out problem's code reaches the tokenizer or the model.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import json
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

# KernelBench PR 67 "eval" problems (SOURCE.md): always held out, so the split also keeps their choice.
PR67_EVAL_PROBLEMS = {
    1: {7, 10, 14, 26, 29, 34, 38, 56, 64, 74},
    2: {3, 7, 17, 19, 30, 55, 58, 59, 67, 81},
}
TASKS = ("kernelbench", "dice_infill", "cu_infill")
INFILL_KINDS = ("statement", "statements", "loop_body", "kernel_body")


@dataclass(frozen=True)
class Example:
    """One chat example. ``prompt`` is the rendered ChatML prompt up to and including the assistant header
    (and the template's response prefix); ``response`` is the text the model must produce."""

    id: str
    group: str  # problem key "L{level}P{id}": the unit of the held-out split
    task: str  # one of TASKS
    source: str  # data folder (and kind for generated examples)
    prompt: str
    response: str
    meta: dict | None = None  # for evaluation: prefix/middle/suffix of infill examples

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Example:
        return cls(**json.loads(line))


# --------------------------------------------------------------------------------------------------------
# Reading the sources


@dataclass(frozen=True)
class Solution:
    group: str
    source: str
    ref_src: str  # the PyTorch reference (class Model ...)
    program: str | None  # the ModelNew program (plain python, no fences), None for reference-only records


def problem_key(level: int, problem_id: int | str) -> str:
    return f"L{int(level)}P{int(problem_id)}"


_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)


def _extract_reference(question: str) -> str | None:
    """The reference architecture from a KernelBench prompt: the last code fence before 'Optimize ...'."""
    head = question.split("Optimize the architecture named Model", 1)[0]
    blocks = re.findall(r"```(?:python)?\n?(.*?)```", head, flags=re.DOTALL)
    if not blocks:
        return None
    code = blocks[-1]
    lines = code.splitlines()
    # The template indents the fence by four spaces; the code itself starts at column 0 after line 1.
    return "\n".join(line.rstrip() for line in lines).strip() + "\n"


def _strip_fence(answer: str) -> str:
    match = _FENCE.search(answer)
    return (match.group(1) if match else answer).strip() + "\n"


def read_pr67(folder: Path) -> Iterator[Solution]:
    import pyarrow.parquet as pq

    for name in ("sft_dataset_best_4_train.parquet", "sft_dataset_best_4_eval.parquet"):
        for row in pq.read_table(folder / name).to_pylist():
            ref = _extract_reference(row["question"])
            if ref is None:
                continue
            program = _strip_fence(row["answer"])
            if "ModelNew" not in program:
                program = None  # a reference-only fallback answer: nothing to learn from
            yield Solution(problem_key(row["level"], row["problem"]), "kernelbench-pr67-dsr1", ref, program)


def read_cuda_l1(folder: Path) -> Iterator[Solution]:
    for name in ("h100.json", "a100.json"):
        with open(folder / name, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                code = row.get("custom_code")
                program = code.strip() + "\n" if code and code != "None" and "ModelNew" in code else None
                yield Solution(
                    problem_key(row["level_id"], row["task_id"]), f"cuda-l1/{name}", row["ref_code"], program
                )


def read_kernelbench(folder: Path) -> Iterator[Solution]:
    with open(folder / "problems.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            yield Solution(problem_key(row["level"], row["problem_id"]), "kernelbench", row["code"], None)


def read_all(data_dir: Path) -> list[Solution]:
    out: list[Solution] = []
    readers = (
        ("kernelbench-pr67-dsr1", read_pr67),
        ("cuda-l1", read_cuda_l1),
        ("kernelbench", read_kernelbench),
    )
    for folder, reader in readers:
        if (data_dir / folder).is_dir():
            out.extend(reader(data_dir / folder))
    if not out:
        raise FileNotFoundError(f"no known data folder under {data_dir}")
    return out


# --------------------------------------------------------------------------------------------------------
# CUDA source strings and infill cuts


@dataclass(frozen=True)
class CudaString:
    """A CUDA source string inside a python program: ``program[start:end] == text``."""

    text: str
    start: int
    end: int


def cuda_strings(program: str) -> list[CudaString]:
    """String constants of ``program`` that hold device code (``__global__``), with their character span."""
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return []
    line_starts = [0]
    for line in program.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    out = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value
        ):
            continue
        if node.end_lineno is None or node.end_col_offset is None:
            continue

        # ast column offsets are UTF-8 byte offsets within the line.
        def offset(lineno: int, col: int) -> int:
            line = program[line_starts[lineno - 1] : line_starts[lineno]]
            return line_starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))

        start, end = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        literal = program[start:end]
        inner = literal.find(node.value[:40]) if node.value else -1
        if inner < 0 or program[start + inner : start + inner + len(node.value)] != node.value:
            continue  # escapes or implicit concatenation: the text is not verbatim in the program
        out.append(CudaString(node.value, start + inner, start + inner + len(node.value)))
    out.sort(key=lambda s: s.start)
    return out


_PARSER = None


def _cuda_parser():
    global _PARSER
    if _PARSER is None:
        import tree_sitter
        import tree_sitter_cuda

        _PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))
    return _PARSER


STATEMENT_TYPES = frozenset(
    {
        "declaration",
        "expression_statement",
        "return_statement",
        "if_statement",
        "for_statement",
        "while_statement",
        "do_statement",
        "break_statement",
        "continue_statement",
    }
)


@dataclass(frozen=True)
class InfillCut:
    """``text[:start]`` + ``text[end:]`` around a hidden middle ``text[start:end]`` (character offsets)."""

    kind: str
    start: int
    end: int


def _device_functions(root) -> Iterator:
    for node in root.children:
        if node.type != "function_definition":
            continue
        qualifiers = {c.type for c in node.children}
        if "__global__" in qualifiers or "__device__" in qualifiers:
            body = node.child_by_field_name("body")
            if body is not None:
                yield node, body


def _inner_span(src: bytes, body) -> tuple[int, int] | None:
    """Byte span of a compound statement's content, without the braces and surrounding whitespace."""
    inner = src[body.start_byte + 1 : body.end_byte - 1]
    stripped = inner.strip()
    if not stripped:
        return None
    lead = len(inner) - len(inner.lstrip())
    return body.start_byte + 1 + lead, body.start_byte + 1 + lead + len(stripped)


def infill_cuts(text: str) -> list[InfillCut]:
    """Every candidate hole of a CUDA source: statements, runs of 2-4 statements, loop bodies, device
    function bodies. Offsets are character offsets into ``text``."""
    src = text.encode("utf-8")
    tree = _cuda_parser().parse(src)
    byte_cuts: list[tuple[str, int, int]] = []
    for fn, body in _device_functions(tree.root_node):
        span = _inner_span(src, body)
        if span and "__global__" in {c.type for c in fn.children}:
            byte_cuts.append(("kernel_body", *span))
        stack = [body]
        while stack:
            block = stack.pop()
            stmts = [c for c in block.named_children if c.type in STATEMENT_TYPES and not c.has_error]
            for s in stmts:
                if b"\n" not in src[s.start_byte : s.end_byte] and s.end_byte - s.start_byte >= 6:
                    byte_cuts.append(("statement", s.start_byte, s.end_byte))
            for i in range(len(stmts) - 1):
                j = min(len(stmts), i + 2 + (s_hash(stmts[i].start_byte) % 3))
                byte_cuts.append(("statements", stmts[i].start_byte, stmts[j - 1].end_byte))
            for s in block.named_children:
                for sub in s.named_children:
                    if sub.type == "compound_statement":
                        stack.append(sub)
                        if s.type in ("for_statement", "while_statement"):
                            span = _inner_span(src, sub)
                            if span:
                                byte_cuts.append(("loop_body", *span))
    # bytes -> characters
    char_of = _byte_to_char_map(text)
    return [InfillCut(k, char_of[a], char_of[b]) for k, a, b in byte_cuts]


def s_hash(value: int) -> int:
    return int(hashlib.blake2b(str(value).encode(), digest_size=4).hexdigest(), 16)


def _byte_to_char_map(text: str) -> list[int]:
    out = []
    for i, ch in enumerate(text):
        out.extend([i] * len(ch.encode("utf-8")))
    out.append(len(text))
    return out


# --------------------------------------------------------------------------------------------------------
# Rendering with the engine's templates (the same strings the engine prompts with at inference)


def render_kernelbench(ref_src: str, program: str) -> tuple[str, str]:
    """DICE whole-program generation: the KernelBench one-shot prompt; the answer is one python block."""
    from engine.prompts import kernelbench_prompt

    return kernelbench_prompt(ref_src), f"```python\n{program.rstrip()}\n```"


def render_cu_infill(prefix: str, middle: str, suffix: str) -> tuple[str, str]:
    """``.cu`` infilling through the engine's infill prompt (no PyTorch context).

    The prompt ends with the response prefix the engine pre-fills (code fence + prefix). The target is the
    middle followed by the suffix up to its first non-blank line: the engine stops once that line appears
    (``engine.prompts.extract_middle``), so the model learns where the hole ends without copying the whole
    suffix.
    """
    from engine.prompts import infill_prompt

    prompt, response_prefix = infill_prompt(prefix, suffix, context=None)
    head_end = _first_line_end(suffix)
    return prompt + response_prefix, middle + suffix[:head_end]


def _first_line_end(text: str) -> int:
    pos = 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if line.strip():
            return pos
    return len(text)


def render_dice_infill(ref_src: str, program: str, cuda: CudaString) -> tuple[str, str]:
    """DICE BiC-RL phase-1 infilling: the PyTorch reference and the program around its CUDA source string are
    shown; the response (after the pre-filled fence + prefix) is the CUDA source, the suffix and the fence."""
    from engine.prompts import infill_prompt

    prefix, middle, suffix = program[: cuda.start], cuda.text, program[cuda.end :]
    prompt, response_prefix = infill_prompt(prefix, suffix, context=ref_src)
    return prompt + response_prefix, f"{middle}{suffix.rstrip()}\n```"


# --------------------------------------------------------------------------------------------------------
# Corpus


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
            cuts = [c for c in infill_cuts(cs.text) if 0 < c.end - c.start <= cfg.max_middle_chars]
            if not cuts:
                continue
            by_kind: dict[str, list[InfillCut]] = {}
            for c in cuts:
                by_kind.setdefault(c.kind, []).append(c)
            kinds = sorted(by_kind)
            for v in range(cfg.cu_variants):
                # Balance kinds: statement-level holes (the editor's main use) get half the variants.
                kind = "statement" if ("statement" in by_kind and v % 2 == 0) else rng.choice(kinds)
                cut = rng.choice(by_kind[kind])
                prefix, middle, suffix = (
                    cs.text[: cut.start],
                    cs.text[cut.start : cut.end],
                    cs.text[cut.end :],
                )
                prompt, response = render_cu_infill(prefix, middle, suffix)
                meta = {"kind": kind, "prefix": prefix, "middle": middle, "suffix": suffix}
                examples.append(
                    Example(
                        f"cu-{ckey[:12]}-{v}",
                        sol.group,
                        "cu_infill",
                        f"{sol.source}:{kind}",
                        prompt,
                        response,
                        meta,
                    )
                )
    return examples


def build_corpus(cfg: CorpusConfig) -> dict:
    """Write train.jsonl.gz, heldout.jsonl.gz, tokenizer_text.txt and corpus_stats.json in ``cfg.out_dir``."""
    solutions = read_all(cfg.data_dir)
    held = split_groups((s.group for s in solutions), cfg.heldout_fraction, cfg.seed)
    examples = build_examples(solutions, cfg)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    stats: dict = {"train": {}, "heldout": {}, "heldout_groups": sorted(held)}
    # gzip: the examples repeat the prompt template and whole CUDA files, so they shrink ~40x.
    with (
        _open_text(cfg.out_dir / "train.jsonl.gz", "wt") as tr,
        _open_text(cfg.out_dir / "heldout.jsonl.gz", "wt") as ho,
    ):
        for ex in examples:
            split = "heldout" if ex.group in held else "train"
            (ho if split == "heldout" else tr).write(ex.to_json() + "\n")
            stats[split][ex.task] = stats[split].get(ex.task, 0) + 1
    # Tokenizer text: training-split programs and references only (held-out problems never reach it).
    with open(cfg.out_dir / "tokenizer_text.txt", "w", encoding="utf-8") as fh:
        for sol in solutions:
            if sol.group in held:
                continue
            fh.write(sol.ref_src + "\n")
            if sol.program:
                fh.write(sol.program + "\n")
    stats["problems"] = {"total": len({s.group for s in solutions}), "heldout": len(held)}
    (cfg.out_dir / "corpus_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _open_text(path: Path, mode: str = "rt"):
    if str(path).endswith(".gz"):
        import gzip

        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def read_examples(path: Path) -> list[Example]:
    """Examples from a .jsonl (or .jsonl.gz) file."""
    with _open_text(Path(path)) as fh:
        return [Example.from_json(line) for line in fh if line.strip()]


# --------------------------------------------------------------------------------------------------------
# Tokenising and packing


@dataclass(frozen=True)
class ChatSpecials:
    """Token ids of the chat protocol: the response ends with ``<|im_end|>\\n`` and is padded with eos."""

    eos_id: int
    im_end_id: int


def chat_sequence(
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    specials: ChatSpecials,
    block_size: int,
    newline_ids: Sequence[int],
) -> tuple[list[int], list[bool]]:
    """ids and loss mask of one example: prompt (no loss) + response + ``<|im_end|>\\n`` + eos padding to a
    multiple of the block size (all with loss), as in DICE (LLaMA-Factory, template qwen3, block_length 4)."""
    response = [*response_ids, specials.im_end_id, *newline_ids]
    ids = [*prompt_ids, *response]
    pad = (-len(ids)) % block_size
    ids += [specials.eos_id] * pad
    loss = [False] * len(prompt_ids) + [True] * (len(response) + pad)
    return ids, loss


def encode_example(
    encode, ex: Example, specials: ChatSpecials, block_size: int, newline_ids: Sequence[int]
) -> tuple[list[int], list[bool]]:
    """:func:`chat_sequence` of one example, prompt and response encoded separately (as the engine encodes
    the prompt alone at inference)."""
    return chat_sequence(encode(ex.prompt), encode(ex.response), specials, block_size, newline_ids)


@dataclass
class PackedRows:
    """Packed training rows, all (N, T): ids, per-document positions, document ids, loss mask."""

    input_ids: Tensor
    position_ids: Tensor
    doc_ids: Tensor
    loss_mask: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def save(self, path: Path) -> None:
        """``.npz``: compressed, int16 where the values fit (the device transfer is size-limited); any other
        suffix: safetensors."""
        path = Path(path)
        if path.suffix == ".npz":
            import numpy as np

            small = int(self.input_ids.max()) < 2**15 and self.input_ids.shape[1] < 2**15
            dtype = np.int16 if small else np.int32
            np.savez_compressed(
                path,
                input_ids=self.input_ids.numpy().astype(dtype),
                position_ids=self.position_ids.numpy().astype(dtype),
                doc_ids=self.doc_ids.numpy().astype(dtype),
                loss_mask=self.loss_mask.numpy(),
            )
            return
        from safetensors.torch import save_file

        save_file(
            {
                "input_ids": self.input_ids.to(torch.int32).contiguous(),
                "position_ids": self.position_ids.to(torch.int32).contiguous(),
                "doc_ids": self.doc_ids.to(torch.int32).contiguous(),
                "loss_mask": self.loss_mask.to(torch.uint8).contiguous(),
            },
            str(path),
        )

    @classmethod
    def load(cls, path: Path) -> PackedRows:
        path = Path(path)
        if path.suffix == ".npz":
            import numpy as np

            with np.load(path) as z:
                t = {k: torch.from_numpy(z[k]) for k in ("input_ids", "position_ids", "doc_ids", "loss_mask")}
        else:
            from safetensors.torch import load_file

            t = load_file(str(path))
        return cls(
            t["input_ids"].long(), t["position_ids"].long(), t["doc_ids"].long(), t["loss_mask"].bool()
        )


def pack(
    sequences: Sequence[tuple[list[int], list[bool]]], seq_len: int, block_size: int, pad_id: int
) -> tuple[PackedRows, int]:
    """Greedy first-fit-decreasing packing of block-aligned sequences into rows of ``seq_len`` tokens.

    Sequences longer than ``seq_len`` are dropped (DICE's ``truncate_mode: drop``); returns the rows and the
    number dropped. Row tails are eos padding in a document of their own, with no loss.
    """
    if seq_len % block_size:
        raise ValueError(f"seq_len {seq_len} is not a multiple of block size {block_size}")
    keep = [(ids, loss) for ids, loss in sequences if len(ids) <= seq_len]
    dropped = len(sequences) - len(keep)
    for ids, _ in keep:
        if len(ids) % block_size:
            raise ValueError("every sequence must be padded to a multiple of the block size before packing")
    # Best-fit decreasing: each sequence goes to the fullest row it still fits in (free space kept sorted).
    order = sorted(range(len(keep)), key=lambda i: -len(keep[i][0]))
    rows: list[list[int]] = []  # indices into keep
    free: list[tuple[int, int]] = []  # sorted (free tokens, row)
    for i in order:
        n = len(keep[i][0])
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            space, r = free.pop(j)
            rows[r].append(i)
            if space - n:
                bisect.insort(free, (space - n, r))
        else:
            rows.append([i])
            if seq_len - n:
                bisect.insort(free, (seq_len - n, len(rows) - 1))
    n_rows = len(rows)
    input_ids = torch.full((n_rows, seq_len), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n_rows, seq_len), dtype=torch.long)
    doc_ids = torch.zeros((n_rows, seq_len), dtype=torch.long)
    loss_mask = torch.zeros((n_rows, seq_len), dtype=torch.bool)
    for r, members in enumerate(rows):
        pos = 0
        for d, i in enumerate(members):
            ids, loss = keep[i]
            n = len(ids)
            input_ids[r, pos : pos + n] = torch.tensor(ids)
            position_ids[r, pos : pos + n] = torch.arange(n)
            doc_ids[r, pos : pos + n] = d
            loss_mask[r, pos : pos + n] = torch.tensor(loss)
            pos += n
        if pos < seq_len:
            position_ids[r, pos:] = torch.arange(seq_len - pos)
            doc_ids[r, pos:] = len(members)
    return PackedRows(input_ids, position_ids, doc_ids, loss_mask), dropped


def tokenize_and_pack(
    examples: Sequence[Example], tokenizer, *, seq_len: int, block_size: int
) -> tuple[PackedRows, dict]:
    """Encode with an ``engine.tokenizer.Tokenizer`` and pack. Returns rows and counts for the log."""
    specials = ChatSpecials(eos_id=tokenizer.eos_id, im_end_id=tokenizer.im_end_id)
    newline = tokenizer.encode("\n")
    prompts = tokenizer.encode_batch([ex.prompt for ex in examples])
    responses = tokenizer.encode_batch([ex.response for ex in examples])
    seqs = [
        chat_sequence(p, r, specials, block_size, newline) for p, r in zip(prompts, responses, strict=True)
    ]
    rows, dropped = pack(seqs, seq_len, block_size, tokenizer.eos_id)
    kept_tokens = sum(len(s[0]) for s in seqs if len(s[0]) <= seq_len)
    stats = {
        "examples": len(examples),
        "dropped_longer_than_seq_len": dropped,
        "rows": len(rows),
        "tokens": kept_tokens,
        "answer_tokens": int(rows.loss_mask.sum()),
        "fill": kept_tokens / max(1, len(rows) * seq_len),
    }
    return rows, stats
