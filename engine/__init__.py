"""DICE/SDAR block-diffusion inference: load a checkpoint, decode token ids, fill CUDA code holes."""

from engine.decode import GenerationOutput, StepEvent
from engine.engine import Completion, Engine, load_engine
from engine.errors import Cancelled, CheckpointError, ConfigError, UnsupportedArchitectureError
from engine.model import DiceModel, ModelConfig

__all__ = [
    "Cancelled",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "DiceModel",
    "Engine",
    "GenerationOutput",
    "ModelConfig",
    "StepEvent",
    "UnsupportedArchitectureError",
    "load_engine",
]
