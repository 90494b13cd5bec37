"""The accelerate configs shipped in training/configs: they load, name real classes, and let DeepSpeed follow
the SFT config for accumulation and clipping."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

import engine.model
from training.config import SFTConfig
from training.sft import align_deepspeed_config

CONFIGS = Path(__file__).resolve().parents[2] / "training" / "configs"
YAMLS = sorted(CONFIGS.glob("*.yaml"))


def test_every_shipped_config_is_there() -> None:
    names = {p.name for p in YAMLS}
    assert {
        "single_gpu.yaml",
        "ddp.yaml",
        "fsdp.yaml",
        "fsdp_multinode.yaml",
        "deepspeed_zero2.yaml",
        "deepspeed_zero3.yaml",
        "cpu_gloo.yaml",
    } <= names


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_config_loads_in_accelerate(path: Path) -> None:
    config = load_config_from_file(str(path))
    assert config.num_processes >= 1 and config.num_machines >= 1
    kind = config.distributed_type.value
    if kind == "FSDP":
        fsdp = config.fsdp_config
        assert fsdp["fsdp_version"] == 2
        # the wrap unit must be the engine's decoder layer class, or FSDP wraps nothing
        assert isinstance(getattr(engine.model, fsdp["fsdp_transformer_layer_cls_to_wrap"]), type)
    if kind == "DEEPSPEED":
        ds = config.deepspeed_config
        assert ds["zero_stage"] in (2, 3)
        # left out so that DeepSpeed follows --grad-accum / --grad-clip (align_deepspeed_config)
        assert "gradient_accumulation_steps" not in ds and "gradient_clipping" not in ds
        if ds["zero_stage"] == 3:
            assert ds["zero3_save_16bit_model"] is True  # the export gathers full weights to rank 0


def _ds_config(gas: object = "auto", clip: object = "auto") -> dict:
    """What accelerate's DeepSpeedPlugin holds before prepare() (printed from a real launch of
    deepspeed_zero2.yaml, accelerate 1.15; ``--gradient_accumulation_steps 4`` puts 4 in the first field)."""
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": gas,
        "zero_optimization": {"stage": 2},
        "gradient_clipping": clip,
    }


def test_deepspeed_follows_the_sft_config_when_left_to_auto() -> None:
    ds = _ds_config()
    align_deepspeed_config(ds, SFTConfig("d", grad_accum=4, grad_clip=0.5))
    assert ds["gradient_accumulation_steps"] == 4 and ds["gradient_clipping"] == 0.5
    ds = _ds_config(gas=4, clip=0.5)  # the same values set explicitly: fine
    align_deepspeed_config(ds, SFTConfig("d", grad_accum=4, grad_clip=0.5))
    ds = {"zero_optimization": {"stage": 3}}  # keys absent altogether
    align_deepspeed_config(ds, SFTConfig("d", grad_accum=2))
    assert ds["gradient_accumulation_steps"] == 2 and ds["gradient_clipping"] == 1.0


def test_deepspeed_values_that_disagree_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps = 4 .* --grad-accum 1"):
        align_deepspeed_config(_ds_config(gas=4), SFTConfig("d", grad_accum=1))
    with pytest.raises(ValueError, match=r"gradient_clipping = 1.0 .* --grad-clip 0.0"):
        align_deepspeed_config(_ds_config(clip=1.0), SFTConfig("d", grad_clip=0.0))
