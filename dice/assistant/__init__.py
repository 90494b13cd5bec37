"""The assistant service: masks -> prompts -> engine -> validator -> ranking, used by the CLI and dice-lsp."""

from dice.assistant.ranking import rank, rank_key
from dice.assistant.service import AssistantService, extract_program
from dice.assistant.types import (
    AssistantSettings,
    Candidate,
    DocumentCompletion,
    MaskCompletion,
    ModelInfo,
    Progress,
    RankedProgram,
)

__all__ = [
    "AssistantService",
    "AssistantSettings",
    "Candidate",
    "DocumentCompletion",
    "MaskCompletion",
    "ModelInfo",
    "Progress",
    "RankedProgram",
    "extract_program",
    "rank",
    "rank_key",
]
