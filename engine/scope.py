"""Identifier-scoped decoding: a fill may only spell the names its prompt already shows.

A small model's commonest failure in a real file is a name that does not exist there: on the held-out
real-project holes, 112 of the 178 failing candidates of the embedded model failed on ``identifier "..." is
undefined`` (``benchmarks/results/dice_tiny_realcode_h200.md``). Monitor-guided decoding (Agrawal et al.,
"Guiding Language Models of Code with Global Context using Monitors", NeurIPS 2023) masks the tokens a
static analysis says cannot continue the code; this is its simplest form, with no analysis beyond the
prompt's text: every vocabulary token that spells part of a word (a run of letters, digits after a letter,
``_`` or ``$``) is masked unless it is one of the tokens the prompt's own words, or a fixed lexicon of C++ and
CUDA keywords, types, built-in variables and math functions, are spelled with. Punctuation, operators,
whitespace, numbers (``1e-5f``, ``0x1F``) and the special tokens are never masked, so a fill can still be any
expression over the names in view, and a declaration can name a new variable from the same pieces.

Why not tree-sitter's scopes: the prompt is a window of a file that may not parse, a name declared in an
included header is in scope without appearing, and the product's validator decides what compiles anyway; the
mask only keeps the decoder from spending its few candidates on names the file cannot have. It is a setting
of the model (``dice.json``: ``{"identifier_scope": "prompt"}``, ``engine.model_settings``): right for the
embedded model, wrong for a large model that knows library APIs the file has not used yet.

A word's spelling in tokens depends on the character before it (the Qwen2 pre-tokenizer glues one
non-letter to a run of letters: ``(idx``, `` idx``, ``.x``), so each word is encoded after each such
character; the spellings are cached per word, so a file's second request encodes only its new words.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable

import torch
from torch import Tensor

from engine.tokenizer import Tokenizer

_WORD = re.compile(r"[A-Za-z_$][\w$]*")
# A token's text spells part of a word when it holds a letter, "_" or "$" that is not inside a number
# (``1e-5f``, ``0x1F``, ``2u``: a run that starts with a digit, or ``.5f``).
_NUMBER_RUN = re.compile(r"(?<![\w$.])\.?\d[\w.]*")
_WORD_CHAR = re.compile(r"[A-Za-z_$]")
# The characters the pre-tokenizer may glue to the front of a word (one of them, or none).
_LEADS = ("", " ", "\t", "(", ")", "[", "]", "{", "}", ".", ",", ";", ":", "*", "&", "!", "~", "-", "+", "=")
_LEADS += ("<", ">", "/", "%", "^", "|", "?", "#", '"', "'", "\\", "@", "`")

# Words every CUDA C++ fill may use whether or not the window shows them: keywords, fundamental and vector
# types, built-in variables, the commonest intrinsics and math functions, and one-letter names.
_LEXICON_TEXT = """
    alignas alignof auto bool break case catch char const constexpr const_cast continue decltype default
    delete do double dynamic_cast else enum explicit extern false float for friend goto if inline int long
    mutable namespace new noexcept nullptr operator private protected public register reinterpret_cast
    return short signed sizeof static static_assert static_cast struct switch template this throw true try
    typedef typeid typename union unsigned using virtual void volatile while NULL
    size_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t half half2 __half __half2
    __nv_bfloat16 __nv_bfloat162 float2 float3 float4 int2 int3 int4 uint2 uint3 uint4 double2 dim3
    char2 char4 uchar4 short2 long2 longlong2
    __global__ __device__ __host__ __shared__ __constant__ __restrict__ __forceinline__ __noinline__
    __launch_bounds__ __managed__ threadIdx blockIdx blockDim gridDim warpSize x y z w
    __syncthreads __syncwarp __threadfence __threadfence_block __shfl_sync __shfl_down_sync __shfl_up_sync
    __shfl_xor_sync __ballot_sync __any_sync __all_sync __activemask __popc __clz __ffs __ldg __fdividef
    __expf __logf __sinf __cosf __powf __fmaf_rn __fmul_rn __fadd_rn __float2half __half2float
    __float2int_rn __int_as_float __float_as_int __saturatef atomicAdd atomicSub atomicMax atomicMin
    atomicExch atomicCAS atomicAnd atomicOr atomicXor
    min max abs fabs fabsf sqrt sqrtf rsqrt rsqrtf exp expf exp2f log logf log2f log1pf pow powf sin sinf
    cos cosf tan tanf tanh tanhf erf erff fma fmaf fmax fmaxf fmin fminf floor floorf ceil ceilf round roundf
    isnan isinf make_float2 make_float3 make_float4 make_int2 make_int4 INFINITY FLT_MAX FLT_MIN
    cudaError_t cudaSuccess cudaStream_t cudaGetLastError cudaMalloc cudaFree cudaMemcpy cudaMemset
    cudaMemcpyHostToDevice cudaMemcpyDeviceToHost cudaDeviceSynchronize std
    a b c d e f g h i j k l m n o p q r s t u v
"""
LEXICON: tuple[str, ...] = tuple(_LEXICON_TEXT.split())


def is_word_piece(text: str) -> bool:
    """Whether a token's text spells part of a word (outside number literals)."""
    return _WORD_CHAR.search(_NUMBER_RUN.sub("", text)) is not None


class IdentifierScope:
    """Per tokenizer: which token ids spell words, and each word's spellings (cached, LRU)."""

    def __init__(self, tokenizer: Tokenizer, *, cache_words: int = 200_000) -> None:
        self.tokenizer = tokenizer
        vocab = tokenizer.vocab_size
        special = {tokenizer.eos_id, tokenizer.pad_id, tokenizer.im_start_id, tokenizer.im_end_id}
        words = torch.zeros(vocab, dtype=torch.bool)
        for i in range(vocab):
            if i not in special and is_word_piece(tokenizer.decode([i])):
                words[i] = True
        self.free = ~words  # always allowed: punctuation, whitespace, numbers, special tokens
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_words = cache_words
        self._lexicon = torch.zeros(vocab, dtype=torch.bool)
        self._lexicon[list(self._spellings(LEXICON))] = True
        self.free |= self._lexicon

    def _spellings(self, words: Iterable[str]) -> set[int]:
        """The token ids of every word after every lead character, from the cache or encoded now."""
        ids: set[int] = set()
        new = []
        for w in dict.fromkeys(words):
            hit = self._cache.get(w)
            if hit is None:
                new.append(w)
            else:
                self._cache.move_to_end(w)
                ids.update(hit)
        if new:
            texts = [lead + w for w in new for lead in _LEADS]
            encoded = self.tokenizer.encode_batch(texts)
            n = len(_LEADS)
            for k, w in enumerate(new):
                spelled = {t for row in encoded[k * n : (k + 1) * n] for t in row}
                self._cache[w] = tuple(sorted(spelled))
                ids.update(spelled)
            while len(self._cache) > self._cache_words:
                self._cache.popitem(last=False)
        return ids

    def allowed(self, text: str) -> Tensor:
        """(V,) bool: the tokens a fill may use when ``text`` (the prompt) is all the code in view."""
        mask = self.free.clone()
        ids = self._spellings(_WORD.findall(text))
        if ids:
            mask[list(ids)] = True
        return mask
