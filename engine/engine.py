"""``load_engine`` and ``Engine``: a loaded checkpoint with the decode loop, infilling, program generation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.checkpoint import load_model, parse_dtype
from engine.cpu_threads import CpuThreadPolicy
from engine.decode import BlockEvent, DecodeSettings, GenerationOutput, StepEvent, decode, prefill
from engine.errors import CheckpointError
from engine.infill import InfillPlan
from engine.kv_cache import PrefixCache
from engine.locate import resolve_model_path
from engine.model import DiceModel, ModelConfig
from engine.model_settings import read_identifier_scope
from engine.prompts import infill_opening, kernelbench_prompt
from engine.runner import CudaGraphRunner, EagerRunner
from engine.sampling import SamplingParams
from engine.scope import IdentifierScope
from engine.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

# Below this size a CPU forward is a few tiny matmuls: a thread whose core another process holds makes each
# op wait (measured 2.4-20x slower on a loaded 2-core machine), so such models use only the cores that are
# idle at the time of the request (engine.cpu_threads).
SMALL_CPU_MODEL = 50_000_000


@contextlib.contextmanager
def _threads(policy: CpuThreadPolicy | None) -> Iterator[None]:
    if policy is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(policy.choose())
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class Completion:
    text: str  # infill: the middle only; generate_program: the whole answer
    confidence: float  # mean confidence of the committed tokens (0.0 when none)
    step_map: list[int]
    token_ids: list[int]
    finished: bool  # the answer ended (suffix start / stop token) rather than running out of tokens


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but CUDA is not available")
    return device


class Engine:
    """Token ids in, token ids out; the text helpers (``infill``, ``generate_program``) sit on top."""

    def __init__(
        self,
        model: DiceModel,
        tokenizer: Tokenizer,
        *,
        name: str = "model",
        path: Path | None = None,
        cuda_graphs: bool | None = None,
        compile: bool = False,
        fuse_projections: bool = False,
        prefix_cache_entries: int = 4,
        prefix_cache_tokens: int = 8192,
        kernels: bool | None = None,
        identifier_scope: bool = False,
    ) -> None:
        self.model = model.eval()
        if fuse_projections:  # the model becomes inference-only (see DiceModel.fuse_projections)
            model.fuse_projections()
        self.tokenizer = tokenizer
        self.name = name
        self.path = path
        # identifier_scope: infills may spell only the prompt's words (engine.scope; the model's dice.json)
        self.identifier_scope = identifier_scope
        self._scope: IdentifierScope | None = None
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        # kernels=None: the Triton step (engine.fast_forward) wherever it runs: inside CUDA graphs, bf16/fp16
        # weights, not asked to torch.compile instead. On the H200 it took the 8B-shape step from 7.60 to
        # 4.87 ms and the 1.7B's from 3.74 to 1.77 ms (benchmarks/results/engine_h200.md); the compiled
        # graph gained far less (7.37 / 3.46 ms) after minutes of compiling, so compile stays opt-in.
        if kernels is None:
            kernels = bool(cuda_graphs) and not compile and fast_kernels_unavailable(model) is None
        kernels = bool(kernels)
        if kernels and not cuda_graphs:
            raise ValueError("the fast kernels run inside CUDA graphs (cuda_graphs=True)")
        self.runner: EagerRunner = (
            CudaGraphRunner(model, compile=compile, kernels=kernels) if cuda_graphs else EagerRunner(model)
        )
        mask_id = model.config.mask_token_id if model.config.mask_token_id is not None else tokenizer.mask_id
        if not 0 <= mask_id < model.config.vocab_size:
            raise CheckpointError(
                f"mask token id {mask_id} is outside the vocabulary ({model.config.vocab_size})"
            )
        self.mask_id = mask_id
        small_cpu = self.device.type == "cpu" and self.num_parameters < SMALL_CPU_MODEL
        self.cpu_threads = CpuThreadPolicy(cap=torch.get_num_threads()) if small_cpu else None
        # Prompt-prefix K/V reuse (0 entries turns it off): the infill template's fixed opening and the n
        # candidates of one request are prefilled once. Bytes per cached token: 2 * layers * kv heads *
        # head_dim * dtype size (4 KB for dice-tiny in float32, 144 KB for an 8B model in bf16).
        self.prefix_cache: PrefixCache | None = (
            PrefixCache(max_entries=prefix_cache_entries, max_tokens=prefix_cache_tokens)
            if prefix_cache_entries > 0 and prefix_cache_tokens > 0
            else None
        )

    def prime_prefix_cache(self, text: str | None = None) -> int:
        """Prefill ``text`` (default: the infilling template's fixed opening, ``infill_opening``) into the
        prefix cache, so that the first request sharing it prefills only the rest. Returns the tokens cached
        (whole blocks; 0 without a prefix cache). Exact: a later prompt reuses only the tokens it shares."""
        if self.prefix_cache is None:
            return 0
        ids = self.tokenizer.encode(infill_opening() if text is None else text)
        bs = self.config.block_size
        blocks = len(ids) // bs
        if blocks == 0:
            return 0
        with _threads(self.cpu_threads), torch.inference_mode():
            cache = self.runner.new_cache(1, blocks * bs, bs)
            cache.reset([0])
            prefill(self.runner, cache, [ids], [blocks], [0], self.tokenizer.pad_id, self.prefix_cache)
        return blocks * bs

    def clear_prefix_cache(self) -> None:
        """Forget cached prompt K/V (needed after the model's weights change)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def release_buffers(self) -> None:
        """Give back the memory kept between generations: the prefix cache, and the graph runner's captured
        graphs and K/V caches (CUDA's cached blocks go back to the device too). Generation still works
        after it; the next one allocates and captures again."""
        self.clear_prefix_cache()
        self.runner.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def kv_bytes_per_slot(self) -> int:
        """Bytes of K/V one cache slot of one row takes: 2 x layers x kv heads x head_dim x dtype size."""
        cfg = self.model.config
        itemsize = self.model.lm_head.weight.element_size()
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())

    @torch.inference_mode()
    def logits(self, input_ids: Tensor) -> Tensor:
        """(B, T, V) float32 logits of full sequences under block-causal attention."""
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        with _threads(self.cpu_threads):
            return self.model(ids.to(self.device)).float()

    def generate(
        self,
        prompt_ids: Sequence[int] | Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        block_size: int | None = None,
        steps_per_block: int | None = None,
        policy: str = "static",
        threshold: float = 0.9,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop_ids: Sequence[int] | None = None,
        seed: int | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        dice_eval_compat: bool = False,
        until: Callable[[int, list[int]], bool] | None = None,
        on_block: Callable[[BlockEvent], None] | None = None,
        allowed: Tensor | None = None,
    ) -> GenerationOutput:
        """Decode new tokens after each prompt (one prompt or a batch of different lengths).

        policy: "static" (top-k per step, k = block/steps), "dynamic" (all above ``threshold``, at least the
        step's quota) or "entropy" (EB-sampler, ``threshold`` = entropy budget in nats). ``stop_ids`` None:
        the tokenizer's ``<|im_end|>`` and eos; [] never stops early. ``dice_eval_compat`` ranks by the
        confidence after top-k/top-p filtering, as DICE's released evaluation script (there: temperature 1,
        top_k 1, static, block 4, 4 steps). ``until(row, ids)`` is asked after each block whether a row is
        done. ``on_step`` may raise (e.g. ``engine.Cancelled``) to stop between steps; ``on_block`` gets every
        row's tokens so far after each block (``engine.decode.BlockEvent``; a server streams from it).
        ``allowed``: (V,) or (B, V) bool over the tokenizer's ids, the tokens a row may produce
        (``engine.scope``; ids past it, the model's padding, are never produced); None: any.
        """
        prompts = self._as_batch(prompt_ids)
        vocab = self.config.vocab_size
        limit = self.config.max_position_embeddings
        for p in prompts:
            if any(not 0 <= t < vocab for t in p):
                raise ValueError(f"prompt token ids must be in [0, {vocab})")
            if len(p) + max_new_tokens > limit:
                raise ValueError(
                    f"prompt ({len(p)}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                    f"max_position_embeddings ({limit})"
                )
        bs = block_size or self.config.block_size
        settings = DecodeSettings(
            block_size=bs,
            steps_per_block=steps_per_block or bs,
            max_new_tokens=max_new_tokens,
            mask_id=self.mask_id,
            pad_id=self.tokenizer.pad_id,
            policy=policy,
            threshold=threshold,
            sampling=SamplingParams(temperature, top_k, top_p, filtered_confidence=dice_eval_compat),
            stop_ids=tuple(self.tokenizer.stop_ids() if stop_ids is None else stop_ids),
        )
        generator = None
        if seed is not None or temperature > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
        if allowed is not None:
            allowed = _pad_vocab(torch.as_tensor(allowed, dtype=torch.bool), vocab)
        with _threads(self.cpu_threads):
            return decode(
                self.runner,
                prompts,
                settings,
                device=self.device,
                generator=generator,
                on_step=on_step,
                until=until,
                prefix_cache=self.prefix_cache,
                on_block=on_block,
                allowed=allowed,
            )

    @staticmethod
    def _as_batch(prompt_ids: Sequence[int] | Sequence[Sequence[int]] | Tensor) -> list[list[int]]:
        if isinstance(prompt_ids, Tensor):
            prompt_ids = prompt_ids.tolist()
        if len(prompt_ids) == 0:
            raise ValueError("empty prompt")
        if isinstance(prompt_ids[0], int):
            return [list(prompt_ids)]  # type: ignore[arg-type]
        return [list(p) for p in prompt_ids]  # type: ignore[union-attr]

    def _completions(self, out: GenerationOutput, texts: list[str]) -> list[Completion]:
        return [
            Completion(
                text=text,
                confidence=sum(c) / len(c) if c else 0.0,
                step_map=s,
                token_ids=ids,
                finished=f,
            )
            for text, ids, s, c, f in zip(
                texts, out.ids, out.step_map, out.confidences, out.finished, strict=True
            )
        ]

    def _sample_n(
        self, prompt: list[int], n: int, max_new_tokens: int, **decode_args: Any
    ) -> GenerationOutput:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        greedy = decode_args.get("temperature", 0.0) == 0
        out = self.generate([prompt] * (1 if greedy else n), max_new_tokens=max_new_tokens, **decode_args)
        if greedy and n > 1:  # identical by construction: decode once
            out = GenerationOutput(
                out.ids * n, out.step_map * n, out.confidences * n, out.finished * n, out.steps
            )
        return out

    def scope_mask(self, prompt_text: str) -> Tensor:
        """(V,) bool: the tokens a fill of ``prompt_text`` may use under the identifier scope
        (``engine.scope``; the per-tokenizer tables are built on first use)."""
        if self._scope is None:
            self._scope = IdentifierScope(self.tokenizer)
        return self._scope.allowed(prompt_text)

    def infill(
        self,
        prefix: str,
        suffix: str,
        *,
        context: str | None = None,
        n: int = 1,
        max_new_tokens: int = 256,
        shape: str | None = None,
        identifier_scope: bool | None = None,
        **decode_args: Any,
    ) -> list[Completion]:
        """Fill the middle between ``prefix`` and ``suffix`` (DICE infilling prompt, response pre-filled with
        the prefix); generation stops when the suffix's first line appears, or where a fill of a ``shape``
        hole ends (``engine.shape``: "statement", "expression", "line"; "block"/None: the suffix only), and
        the middle is cut there. A caller's ``until`` is asked as well. ``identifier_scope`` (None: the
        engine's, from the model's dice.json): the fill spells only words of the prompt and the C++/CUDA
        lexicon (``engine.scope``). Returns the middles only."""
        plan = InfillPlan.make(prefix, suffix, context=context, shape=shape)
        ids = self.tokenizer.encode(plan.prompt_text)
        scoped = self.identifier_scope if identifier_scope is None else identifier_scope
        if scoped and "allowed" not in decode_args:
            decode_args["allowed"] = self.scope_mask(plan.prompt_text)

        def reached_end(row: int, new_ids: list[int]) -> bool:
            return plan.reached_end(self.tokenizer.decode(new_ids))

        also = decode_args.pop("until", None)
        until = reached_end if also is None else (lambda r, x: reached_end(r, x) or bool(also(r, x)))
        out = self._sample_n(ids, n, max_new_tokens, until=until, **decode_args)
        texts, finished = [], []
        for row_ids, done in zip(out.ids, out.finished, strict=True):
            middle, ended = plan.finish(self.tokenizer.decode(row_ids), done)
            texts.append(middle)
            finished.append(ended)
        out = GenerationOutput(out.ids, out.step_map, out.confidences, finished, out.steps)
        return self._completions(out, texts)

    def generate_program(
        self,
        ref_src: str,
        *,
        n: int = 1,
        max_new_tokens: int = 4096,
        variant: str = "eval",
        **decode_args: Any,
    ) -> list[Completion]:
        """Whole-program generation with DICE's KernelBench one-shot prompt; text = the full answer."""
        ids = self.tokenizer.encode(kernelbench_prompt(ref_src, variant=variant))
        out = self._sample_n(ids, n, max_new_tokens, **decode_args)
        return self._completions(out, [self.tokenizer.decode(row) for row in out.ids])


def _pad_vocab(allowed: Tensor, vocab: int) -> Tensor:
    """``allowed`` (..., n) widened to the model's ``vocab`` ids with False (n <= vocab)."""
    n = allowed.shape[-1]
    if n > vocab:
        raise ValueError(f"allowed covers {n} ids, the model has {vocab}")
    if n == vocab:
        return allowed
    return torch.cat([allowed, allowed.new_zeros(*allowed.shape[:-1], vocab - n)], -1)


def _check_token_ids(folder: Path, tokenizer: Tokenizer, vocab: int) -> None:
    """CheckpointError when the tokenizer makes ids the model has no embedding for (an id past vocab_size
    would fail inside the first forward, or silently read another row on some devices)."""
    if tokenizer.vocab_size > vocab:
        raise CheckpointError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size is "
            f"{vocab}: ids from {vocab} on would have no embedding"
        )
    special = {
        "eos": tokenizer.eos_id,
        "pad": tokenizer.pad_id,
        "mask": tokenizer.mask_id,
        "<|im_start|>": tokenizer.im_start_id,
        "<|im_end|>": tokenizer.im_end_id,
    }
    for name, token_id in special.items():
        if token_id is not None and not 0 <= token_id < vocab:
            raise CheckpointError(
                f"{folder}: the tokenizer's {name} token id {token_id} is outside "
                f"config.json vocab_size {vocab}"
            )


def fast_kernels_unavailable(model: DiceModel) -> str | None:
    """None when the Triton step (engine.fast_forward) can run this model here, else why not."""
    try:
        from engine.fast_forward import supported
    except ImportError as exc:  # pragma: no cover - a broken Triton install
        return f"cannot import the fast kernels ({exc})"
    return supported(model)


def load_engine(
    path: str | Path | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    cuda_graphs: bool | None = None,
    compile: bool = False,
    prefix_cache_entries: int = 4,
    prefix_cache_tokens: int = 8192,
    kernels: bool | None = None,
) -> Engine:
    """Load a DICE/SDAR checkpoint folder (None: $DICE_MODEL, else the embedded dice-tiny).

    device None/"auto": CUDA when available. dtype None: the checkpoint's bf16/fp16 on CUDA (bf16 when it is
    stored in float32), float32 on CPU.
    """
    folder = resolve_model_path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    dev = _resolve_device(device)
    target = parse_dtype(dtype)
    if target is None:
        stored = parse_dtype(ModelConfig.from_json(folder).torch_dtype or "bfloat16")
        target = (
            (stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16)
            if dev.type == "cuda"
            else torch.float32
        )
    model = load_model(folder, device=dev, dtype=target)
    tokenizer = load_tokenizer(folder, mask_id=model.config.mask_token_id)
    _check_token_ids(folder, tokenizer, model.config.vocab_size)
    scope = read_identifier_scope(folder) == "prompt"
    return Engine(
        model,
        tokenizer,
        name=folder.name,
        path=folder,
        cuda_graphs=cuda_graphs,
        compile=compile,
        fuse_projections=True,
        prefix_cache_entries=prefix_cache_entries,
        prefix_cache_tokens=prefix_cache_tokens,
        kernels=kernels,
        identifier_scope=scope,
    )
