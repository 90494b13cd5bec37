"""Reinforcement learning for block-diffusion models (issue 20, BiC-RL): TraceRL updates from the engine's
rollouts (``training.rl.trace``), with rollouts, rewards and scheduling in the modules beside it."""
