"""How the KernelBench path builds ``Model`` and ``ModelNew`` and draws their inputs: as KernelBench does.

KernelBench (``src/kernelbench/eval.py``) calls ``torch.manual_seed(seed)`` before ``get_init_inputs()``,
before ``Model(*init_inputs)`` and before ``ModelNew(*init_inputs)``, all on the CPU, then moves both models
(and any tensor init input) to the GPU. Building on the CPU matters: the legacy constructor in
``nn.Parameter(torch.Tensor(out, in))`` (then ``nn.init.kaiming_uniform_``) ignores a
``torch.device("cuda")`` context, so under one the candidate's weights would come from the CPU generator and
the reference's (``nn.Linear``) from the CUDA generator, and a correct kernel would be judged incorrect. Here
both are built the same way, inside an explicit ``torch.device("cpu")`` context (so a default device set by
the candidate's import cannot change it).

Correctness inputs are drawn on the CPU under the trial's seed and moved, as KernelBench does, except when
they are large (:data:`CPU_INPUT_ELEMENTS`; the count is read from shapes made under ``torch.device("meta")``,
which allocates and draws nothing): CPU generation of KernelBench's multi-GB inputs takes seconds per trial
(PyTorch's CPU generator, MT19937, draws ~100-200 M values/s on one core), so those are drawn on the GPU under
the same seed. The values differ from KernelBench's then, not their distribution, and the reference and the
candidate always get the same inputs; the verdict log says which was used.

Everything works with ``device="cpu"`` too (the CPU tests run it). torch is imported lazily.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

SEED = 42
# At most this many input elements are drawn on the CPU: 2**26 (256 MiB of float32) takes ~0.3-0.7 s, so the
# 7 input sets of a run (5 correctness trials, 2 more for timing) stay within ~5 s. KernelBench level 1: 30 of
# 100 problems are under it; the rest (up to 4.3e9 elements, e.g. 4096 x 393216 for the activations) are not.
CPU_INPUT_ELEMENTS = 2**26


def construct_models(
    ref_module: ModuleType, cand_module: ModuleType, device: Any, seed: int = SEED
) -> tuple[Any, Any, str]:
    """``(Model, ModelNew, log line)``: both built on the CPU, each right after ``torch.manual_seed(seed)``,
    from the same init inputs (drawn on the CPU after the same seed; tensors among them moved to ``device``,
    as KernelBench does), then moved to ``device`` and left in training mode, as KernelBench leaves them.
    Exceptions propagate."""
    init = draw_init_inputs(ref_module, seed)
    model, line = construct_model(ref_module.Model, init, device, seed)
    model_new, _ = construct_model(cand_module.ModelNew, init, device, seed)
    return model, model_new, line.replace("model built", "Model and ModelNew built")


def draw_init_inputs(ref_module: ModuleType, seed: int = SEED) -> list[Any]:
    """``get_init_inputs()`` on the CPU right after ``torch.manual_seed(seed)`` (not moved yet)."""
    import torch

    with torch.device("cpu"):
        torch.manual_seed(seed)
        return list(ref_module.get_init_inputs())


def construct_model(cls: Any, init_inputs: list[Any], device: Any, seed: int = SEED) -> tuple[Any, str]:
    """``(cls(*init_inputs) on device, log line)``: built on the CPU right after ``torch.manual_seed(seed)``
    (tensor init inputs moved to ``device`` first, as KernelBench does), then moved, in training mode (the
    mode KernelBench leaves it in: a BatchNorm candidate normalises with the batch's statistics, as the
    reference then does). :func:`construct_models` builds both this way; the judge builds ``Model`` and
    a runner ``ModelNew`` (:mod:`dice.validator.judge`)."""
    import torch

    device = torch.device(device)
    with torch.device("cpu"):
        moved = [_moved(x, device) for x in init_inputs]
        torch.manual_seed(seed)
        model = cls(*moved)
    model = model.to(device)
    line = f"construction: model built on the CPU from seed {seed}"
    if device.type != "cpu":
        line += f", then moved to {device}"
    return model, line


def input_elements(ref_module: ModuleType) -> int | None:
    """How many tensor elements ``get_inputs()`` makes, from the shapes it gives under
    ``torch.device("meta")`` (nothing allocated, nothing drawn); None when it fails there (``.item()``)."""
    import torch

    try:
        with torch.device("meta"):
            inputs = list(ref_module.get_inputs())
    except Exception:  # noqa: BLE001 - any failure only means the size is unknown
        return None
    return sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))


def generate_inputs(
    ref_module: ModuleType, device: Any, seed: int, *, cpu_limit: int = CPU_INPUT_ELEMENTS
) -> tuple[list[Any], str]:
    """``(inputs on device, where they were drawn)``: ``get_inputs()`` right after
    ``torch.manual_seed(seed)``, on the CPU and moved (KernelBench's way), or on ``device`` itself when they
    have more than ``cpu_limit`` elements. Dtypes are kept (integer inputs stay integers). ``where``
    completes the log line ``inputs: ...``."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return _draw(ref_module, device, seed, device), "generated on the CPU (seeded)"
    count = input_elements(ref_module)
    if count is not None and count > cpu_limit:
        where = f"generated on {device} ({count:,} elements: CPU generation would take long)"
        return _draw(ref_module, device, seed, device), where
    unknown = " (size unknown: get_inputs() fails under the meta device)" if count is None else ""
    return _draw(ref_module, torch.device("cpu"), seed, device), (
        f"generated on the CPU (seeded) and moved to {device}{unknown}"
    )


def _draw(ref_module: ModuleType, where: Any, seed: int, device: Any) -> list[Any]:
    import torch

    torch.manual_seed(seed)
    with torch.device(where):
        inputs = list(ref_module.get_inputs())
    return [_moved(x, device) for x in inputs]


def _moved(x: Any, device: Any) -> Any:
    import torch

    return x.to(device) if isinstance(x, torch.Tensor) else x
