"""The configuration of ``dice train rl``: a dataclass whose fields are the ``--kebab-case`` flags.

Kept free of torch imports so that building the ``dice`` parser stays fast. Every field is saved with each
checkpoint (``rl_config.json``) and in ``OUT/config.json`` (the resolved config of the run).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from training.config import CliConfig

PHASES = ("infill", "e2e")
# DICE's step counts per phase (stage 1: 20 steps of infilling, stage 2: 100 steps end to end).
DEFAULT_STEPS = {"infill": 20, "e2e": 100}
SCHEDULES = ("sequential", "mixed")
KL_MODES = ("old", "ref", "none")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass
class RLConfig(CliConfig):
    """Every flag of ``dice train rl`` (``--kebab-case``); DICE's values are the defaults."""

    phase: str = field(metadata={"help": "infill (stage 1) or e2e (stage 2, from stage 1's out/final)"})
    model: str = field(metadata={"help": "checkpoint folder to start from (engine format)"})
    tasks: list[str] = field(
        metadata={
            "help": "task file (CuKe's infill.jsonl, cu_infill.jsonl or e2e.jsonl); repeat for several",
            "action": "append",
        }
    )
    out: str = field(default="runs/rl", metadata={"help": "output folder (metrics, checkpoints, final/)"})
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer folder (default: the --model folder)"}
    )
    steps: int = field(default=0, metadata={"help": "RL steps (0 = DICE's: 20 for infill, 100 for e2e)"})
    max_minutes: float = field(
        default=0.0,
        metadata={
            "help": "stop after the step during which this many minutes of training have passed, then "
            "evaluate and export as after the last step (0 = no limit: --steps only)"
        },
    )
    tasks_per_step: int = field(default=64, metadata={"help": "tasks per step, over all processes"})
    group_size: int = field(default=16, metadata={"help": "samples per task (the advantage group)"})
    max_new_tokens: int = field(default=4096, metadata={"help": "length cap of a rollout's response"})
    temperature: float = field(default=1.0, metadata={"help": "rollout sampling temperature"})
    top_p: float = field(
        default=1.0,
        metadata={
            "help": "rollout nucleus sampling: draw from the smallest set of tokens holding this much "
            "probability (1 = off: DICE; a small model's tail at T 1 is mostly noise)"
        },
    )
    top_k: int = field(default=0, metadata={"help": "rollout top-k sampling (0 = off: DICE)"})
    policy: str = field(
        default="dynamic", metadata={"help": "unmasking policy of the rollouts (engine: static | dynamic)"}
    )
    threshold: float = field(default=0.9, metadata={"help": "confidence threshold of dynamic unmasking"})
    block_size: int = field(
        default=4, metadata={"help": "block size of rollouts and training (0 = the model's)"}
    )
    rollout_rows: int = field(
        default=256, metadata={"help": "rows per engine batch in the rollouts (samples decoded together)"}
    )
    rollout_kv_gb: float = field(
        default=-1.0,
        metadata={
            "help": "cap on one rollout chunk's K/V cache in GB: fewer rows per chunk when it binds "
            "(-1: 40%% of the GPU memory free when the step's rollouts start; 0: no cap)"
        },
    )
    rollout_dtype: str = field(
        default="auto",
        metadata={
            "help": "float32 | bfloat16 | auto (bfloat16 on CUDA: a synced copy; float32 on CPU: "
            "the trained model itself)"
        },
    )
    rollout_cuda_graphs: bool = field(
        default=True, metadata={"help": "CUDA graphs for the rollout engine's steps (CUDA only)"}
    )
    schedule: str = field(
        default="sequential",
        metadata={"help": "sequential (file order, sorted by level: DICE) | mixed (level curriculum)"},
    )
    curriculum_sharpness: float = field(
        default=2.0,
        metadata={"help": "mixed: how strongly a step keeps to its target level (0 = uniform over levels)"},
    )
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate (DICE: 1e-6, constant)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "max gradient norm (0 = off)"})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO clip range epsilon"})
    kl_beta: float = field(default=0.01, metadata={"help": "k3 KL coefficient"})
    kl_mode: str = field(
        default="old",
        metadata={"help": "KL against: old (pre-update log-probs, DICE) | ref (frozen start model) | none"},
    )
    shrink: int = field(default=1, metadata={"help": "merge every s neighbouring decoding steps (TraceRL)"})
    packed: bool = field(
        default=False,
        metadata={"help": "pack a sample's masked copies into one sequence (block-sparse mask)"},
    )
    attention: str = field(
        default="auto", metadata={"help": "training mask: flex | dense | auto (flex on CUDA)"}
    )
    micro_batch_size: int = field(default=4, metadata={"help": "samples per forward in the update"})
    mini_batches: int = field(
        default=1,
        metadata={
            "help": "optimizer steps per RL step: the step's samples split into this many mini-batches "
            "(one epoch; with 1 the ratio to the old log-probs is 1 and clip / KL-to-old only act from "
            "the second)"
        },
    )
    loss_norm: str = field(
        default="response",
        metadata={"help": "per-sample loss divided by: response (its length) | fixed (--max-new-tokens)"},
    )
    speedup_term: bool = field(
        default=False,
        metadata={"help": "e2e: add 0.3 + min(log2(speedup), 2) to a correct sample's reward (off: DICE)"},
    )
    reward: str = field(
        default="validator",
        metadata={"help": "validator (the batch API) | toy:<text> (reward = the text appears; smoke runs)"},
    )
    accept_compiled: bool = field(
        default=False,
        metadata={"help": "CPU smoke runs: also pay 1 for a compiled (not run) KernelBench verdict"},
    )
    validator_workers: int = field(
        default=0, metadata={"help": "validator worker processes (0 = the pool's default)"}
    )
    validator_timeout_s: float = field(default=60.0, metadata={"help": "validator run-phase timeout"})
    overlap_rewards: bool = field(
        default=True,
        metadata={"help": "score a chunk of rollouts while the next chunk is generated"},
    )
    cu_reward: str = field(
        default="match",
        metadata={
            "help": ".cu tasks: match (a compiled fill earns 0.2 + 0.8 x its token similarity to the "
            "original: a no-op that compiles cannot take the reward) | compile (1 for any compiled fill)"
        },
    )
    hole_cut: str = field(
        default="auto",
        metadata={
            "help": ".cu tasks: byte | line | auto (the model's dice.json, as the assistant prompts it)"
        },
    )
    identifier_scope: str = field(
        default="auto",
        metadata={
            "help": ".cu tasks: off | prompt (rollouts spell only the prompt's words and the C++/CUDA "
            "lexicon, engine.scope) | auto (the model's dice.json, as the assistant fills it)"
        },
    )
    cu_window_bytes: int = field(
        default=0,
        metadata={
            "help": ".cu tasks: cap 2*prefix+suffix of the prompt at this many bytes, trimmed as the "
            "assistant trims (0 = the whole file)"
        },
    )
    eval_tasks: str | None = field(
        default=None,
        metadata={"help": "held-out task file (tasks no update sees; never KernelBench's problems file)"},
    )
    eval_every: int = field(
        default=0, metadata={"help": "steps between held-out evaluations (0 = before and after only)"}
    )
    eval_max: int = field(default=0, metadata={"help": "held-out tasks per evaluation (0 = all)"})
    seed: int = field(default=0, metadata={"help": "seed for rollouts and the schedule"})
    device: str = field(default="auto", metadata={"help": "cpu | cuda | auto"})
    mixed_precision: str = field(
        default="auto", metadata={"help": "no | bf16 | fp16 | auto (bf16 on CUDA, else no)"}
    )
    compile: str = field(
        default="auto",
        metadata={
            "help": "torch.compile the trained decoder layers: yes | no | auto (on CUDA, when the rollouts "
            "decode with their own copy)"
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute decoder layers in backward"}
    )
    save_every: int = field(
        default=0, metadata={"help": "steps between resumable checkpoints (0 = at the end only)"}
    )
    resume: str | None = field(
        default=None,
        metadata={
            "help": "resume from the latest checkpoint in --out (or from the folder given)",
            "nargs": "?",
            "const": "latest",
        },
    )
    save_state: bool = field(
        default=True, metadata={"help": "write a resumable checkpoint at the end (else only out/final)"}
    )
    save_dtype: str = field(default="bfloat16", metadata={"help": "dtype of the exported model weights"})
    max_shard_mb: int = field(
        default=0, metadata={"help": "shard exported weights above this size (0 = one file)"}
    )

    @classmethod
    def from_json(cls, path: str | Path) -> RLConfig:
        """A config saved by a run (``rl_config.json``); unknown keys are an error."""
        data = json.loads(Path(path).read_text())
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{path}: unknown config keys {unknown}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @property
    def total_steps(self) -> int:
        return self.steps or DEFAULT_STEPS.get(self.phase, 20)

    @property
    def toy_target(self) -> str | None:
        """The text of ``--reward toy:<text>``, else None."""
        return self.reward.split(":", 1)[1] if self.reward.startswith("toy:") else None

    def validate(self) -> None:
        """ValueError naming the flag for every value the run cannot use (before anything is loaded)."""
        choices = {
            "phase": PHASES,
            "schedule": SCHEDULES,
            "kl_mode": KL_MODES,
            "policy": ("static", "dynamic", "entropy"),
            "device": ("auto", "cpu", "cuda"),
            "mixed_precision": ("auto", "no", "bf16", "fp16"),
            "attention": ("auto", "flex", "dense"),
            "rollout_dtype": ("auto", "float32", "bfloat16", "float16"),
            "loss_norm": ("response", "fixed"),
            "compile": ("auto", "yes", "no"),
            "hole_cut": ("auto", "byte", "line"),
            "identifier_scope": ("auto", "off", "prompt"),
            "cu_reward": ("match", "compile"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{_flag(name)} {getattr(self, name)!r}: use one of {', '.join(allowed)}")
        if not self.tasks:
            raise ValueError("--tasks: give at least one task file")
        for name in (
            "tasks_per_step",
            "group_size",
            "max_new_tokens",
            "micro_batch_size",
            "rollout_rows",
            "mini_batches",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{_flag(name)} must be positive, got {getattr(self, name)}")
        if self.rollout_kv_gb < 0 and self.rollout_kv_gb != -1:
            raise ValueError(
                f"--rollout-kv-gb must be -1 (auto), 0 (no cap) or positive, got {self.rollout_kv_gb}"
            )
        for name in (
            "steps",
            "eval_every",
            "eval_max",
            "save_every",
            "block_size",
            "validator_workers",
            "cu_window_bytes",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.shrink < 1:
            raise ValueError(f"--shrink must be >= 1, got {self.shrink}")
        if self.group_size < 2:
            raise ValueError("--group-size must be >= 2: a group of one sample has no advantage")
        if self.temperature < 0:
            raise ValueError("--temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.threshold <= 1 and self.policy == "dynamic":
            raise ValueError("--threshold must be in (0, 1] for dynamic unmasking")
        if self.lr <= 0 or self.clip_eps <= 0 or self.kl_beta < 0:
            raise ValueError("--lr and --clip-eps must be positive and --kl-beta >= 0")
        if self.reward != "validator" and not (self.reward.startswith("toy:") and self.toy_target):
            raise ValueError(f"--reward {self.reward!r}: use validator or toy:<text> (non-empty text)")
        if self.eval_tasks is not None and self.eval_tasks in self.tasks:
            raise ValueError(f"--eval-tasks {self.eval_tasks}: also a --tasks file; hold out other tasks")
