"""DICE kernel assistant: the command line, CUDA source intelligence, validation and the assistant service."""

__version__ = "0.1.0"
