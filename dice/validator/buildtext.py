"""The source texts the fast build (:mod:`dice.validator.fastbuild`) compiles in place of the ones torch's
``load_inline`` wrote, and when each must give way to the next.

A cold build is mostly torch's headers. ``cuda.cu`` starts with ``#include <torch/types.h>`` (every ATen
operator, autograd's factories) and often ``<torch/extension.h>`` (all of libtorch's C++ API and pybind11),
parsed three times by nvcc (cudafe++, cicc, the host compiler). Measured with nvcc 13 ``--time`` on a 2-core
CPU (torch 2.13), a one-kernel candidate: 164 s with the umbrella include, 23 s user with ``torch/types.h``
alone (*slim*), 12.5 s with :data:`LEAN_PRELUDE` (*lean*: ``ATen/core/Tensor.h``, dispatch macros, torch's
tensor operators, and the per-operator headers of the functions the text calls), 0.5 s with no torch header.
So, in order, each tried only when the one before failed:

* **lean** (:func:`lean_cuda_text`): any error falls back (the prelude may lack what the text needs);
* **slim** (:func:`slim_cuda_text`): only an error that names a torch entity falls back
  (:func:`needs_full_headers`); other errors are the candidate's own and fail the full text the same way;
* **full**: the text torch wrote, compiled as torch would.

Lines and the file name in messages stay the text's (``#line``). Of 80 sampled candidates of the agreement
set with CUDA sources (``benchmarks/validator_agreement.py --pack``), 79 passed nvcc's front end lean; the
lean text did not apply to the 80th (it compiles as torch wrote it). ``DICE_LEAN=0`` skips the lean steps.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

_UMBRELLA = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/(?:extension|torch|all)\.h[>"][ \t]*(?://.*)?$', re.M
)
# what only the umbrella headers declare (torch/types.h covers tensors, factories, dispatch, TORCH_CHECK)
_FULL_API = re.compile(
    r"\b(?:py|pybind11)::|\bpybind11\b|PYBIND11_|"
    r"\btorch::(?:nn|optim|data|jit|serialize|autograd|cuda|fft|linalg|special|nested|sparse|indexing|"
    r"python|utils|mps|xpu|stable|save|load|manual_seed|NoGradGuard|AutoGradMode|"
    r"InferenceMode|enable_grad|set_num_threads|get_num_threads|Module|Function)\b|TORCH_MODULE|THP"
)
# what main.cpp may use that <torch/python.h> (pybind11, torch's casters, torch/types.h, torch::nn::Module)
# does not declare: the rest of torch/all.h
FULL_API_CPP = re.compile(
    r"\btorch::(?:optim|data|jit|serialize|fft|linalg|special|nested|sparse|indexing|cuda|mps|xpu|stable|"
    r"save|load|manual_seed|autograd|Function|nn::(?!Module\b))|TORCH_MODULE"
)
_TORCHISH = re.compile(
    r"[\"'\u2018](?:(?:torch|at|c10|py|pybind11)(?:::\w+)*[\"'\u2019]|(?:TORCH_|AT_|C10_|THP)\w*)"
    r"|\b(?:torch|at|c10|pybind11|py)::"
)


def slim_cuda_text(text: str) -> str | None:
    """``text`` (a ``cuda.cu`` load_inline wrote) with its umbrella torch includes blanked, when it starts
    with ``#include <torch/types.h>`` and uses nothing only they declare; None when nothing changes."""
    if not text.startswith("#include <torch/types.h>\n") or _FULL_API.search(text):
        return None
    slim = _UMBRELLA.sub("", text)
    return slim if slim != text else None


def lean_cuda_text(text: str, filename: str = "cuda.cu") -> str | None:
    """``text`` (a ``cuda.cu`` load_inline wrote) compiled against :data:`LEAN_PRELUDE` and the per-operator
    headers of the ``torch::`` / ``at::`` functions it calls instead of ``torch/types.h`` (which includes
    every operator of ATen, ~2x the compile); None when it needs more (an umbrella-only name, another torch
    header of its own, ``<ATen/ATen.h>``). Line numbers and file name are kept (``#line``)."""
    types = "#include <torch/types.h>\n"
    if not text.startswith(types) or _FULL_API.search(text):
        return None
    body = _UMBRELLA.sub("", text[len(types) :])
    if _HEAVY_INCLUDE.search(body) or _LEAN_CLASH.search(body):
        return None
    folder = _ops_folder()
    if folder is None:
        return None
    names = set(_QUALIFIED_CALL.findall(body))
    if _USING_TORCH.search(body):
        names |= set(_ANY_CALL.findall(body))
    ops = "".join(f"#include <ATen/ops/{n}.h>\n" for n in sorted(names) if (folder / f"{n}.h").is_file())
    return f'{LEAN_PRELUDE}{ops}{LEAN_NAMES}#line 1 "{filename}"\n\n{body}'


LEAN_PRELUDE = (
    "#include <ATen/core/Tensor.h>\n#include <ATen/Dispatch.h>\n#include <c10/util/Exception.h>\n"
    "#include <ATen/TensorOperators.h>\n"
)
# ``ATen/TensorOperators.h`` (``x + y``, ``2 * x`` on tensors: torch's own definitions, kept) includes
# ``ATen/Functions.h``, every operator of ATen, for the one function it calls; the lean compile finds this
# file first on its include path instead (``-I``, that compile only). A header of the candidate that needs
# more of ATen then fails the lean compile, and the slim text, which includes the real one, is compiled.
LEAN_FUNCTIONS = "#pragma once\n#include <ATen/ops/empty_like.h>\n"
# torch/types.h's own names (torch 2.4 - 2.13), after its ``using namespace at``. torch's factories there are
# autograd's (``torch::empty`` = ``at::empty`` + requires_grad from the options); here they are ATen's: the
# same tensors, never requiring grad unless asked (an output the validator compares by value either way).
LEAN_NAMES = (
    "namespace torch {\nusing namespace at;\nusing std::nullopt;\nusing std::optional;\n"
    "using Dtype = at::ScalarType;\n"
    + "".join(
        f"inline constexpr auto {name} = at::{value};\n"
        for name, value in (
            ("kUInt8", "kByte"),
            ("kInt8", "kChar"),
            ("kInt16", "kShort"),
            ("kInt32", "kInt"),
            ("kInt64", "kLong"),
            ("kUInt16", "kUInt16"),
            ("kUInt32", "kUInt32"),
            ("kUInt64", "kUInt64"),
            ("kFloat16", "kHalf"),
            ("kFloat32", "kFloat"),
            ("kFloat64", "kDouble"),
        )
    )
    + "".join(
        f"inline constexpr auto {short} = {long};\n"
        for short, long in (
            ("kU8", "kUInt8"),
            ("kU16", "kUInt16"),
            ("kU32", "kUInt32"),
            ("kU64", "kUInt64"),
            ("kI8", "kInt8"),
            ("kI16", "kInt16"),
            ("kI32", "kInt32"),
            ("kI64", "kInt64"),
            ("kF16", "kFloat16"),
            ("kF32", "kFloat32"),
            ("kF64", "kFloat64"),
        )
    )
    + "}  // namespace torch\n"
)
_HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:torch/|ATen/ATen\.h|ATen/Functions\.h)', re.M)
_LEAN_CLASH = re.compile(r"\bnamespace\s+torch\s*\{")  # its own additions to torch::
_QUALIFIED_CALL = re.compile(r"\b(?:torch|at)::(\w+)\s*(?:<[^;{}()<>]*>\s*)?\(")
_USING_TORCH = re.compile(r"\busing\s+namespace\s+(?:torch|at)\s*;")
_ANY_CALL = re.compile(r"(?<![\w:.>])([a-z_]\w*)\s*\(")


def lean_include_dir(build_dir: Path) -> Path:
    """The folder the lean compile puts first on its include path (holding ``ATen/Functions.h``)."""
    shadow = build_dir / "lean" / "ATen" / "Functions.h"
    shadow.parent.mkdir(parents=True, exist_ok=True)
    shadow.write_text(LEAN_FUNCTIONS, encoding="utf-8")
    return shadow.parent.parent


@lru_cache(maxsize=1)
def _ops_folder() -> Path | None:
    """This torch's per-operator headers (``ATen/ops``), None when it has none."""
    import torch.utils.cpp_extension as cpp_extension

    for root in cpp_extension.include_paths():
        folder = Path(root) / "ATen" / "ops"
        if (folder / "empty.h").is_file():
            return folder
    return None


def lean_enabled() -> bool:
    """Whether the lean steps run (``DICE_LEAN`` unset or not ``0`` / ``false`` / ``no``)."""
    return os.environ.get("DICE_LEAN", "1").strip().lower() not in ("0", "false", "no")


def lean_cpp_text(rest: str) -> str | None:
    """``main.cpp`` after its first line (``#include <torch/extension.h>``), its own umbrella includes blanked
    (the lines kept), for the ``<torch/python.h>`` PCH; None when it names more of libtorch than that."""
    body = _UMBRELLA.sub("", rest)
    return None if FULL_API_CPP.search(body) else body


def needs_umbrella(text: str) -> bool:
    """Whether CUDA source text uses what only ``<torch/extension.h>`` declares (pybind11, torch::nn ...)."""
    return _FULL_API.search(text) is not None


def needs_full_headers(output: str) -> bool:
    """Whether a failed slim compile's errors may come from the headers it left out: any error that names a
    torch, ATen, c10 or pybind11 entity (a missing name, or an overload only the full headers declare, as
    ``no suitable conversion function from "const at::DeprecatedTypeProperties"`` for ``AT_DISPATCH`` on
    ``x.type()``, seen on the H200 with torch 2.11). Errors about the candidate's own code alone (a typo, a
    syntax error) fail the full compile the same way and are not compiled twice."""
    return any(_TORCHISH.search(line) for line in output.splitlines() if "error" in line)
