"""DICE/SDAR block-diffusion inference: load a checkpoint, decode token ids, fill CUDA code holes."""

from engine.decode import GenerationOutput, StepEvent
from engine.engine import Completion, Engine, load_engine
from engine.errors import Cancelled, CheckpointError, ConfigError, UnsupportedArchitectureError
from engine.interface import InferenceEngine
from engine.locate import ModelChoice, choose_model
from engine.model import DiceModel, ModelConfig

__all__ = [
    "Cancelled",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "DiceModel",
    "Engine",
    "GenerationOutput",
    "InferenceEngine",
    "ModelChoice",
    "ModelConfig",
    "StepEvent",
    "UnsupportedArchitectureError",
    "choose_model",
    "load_engine",
]
