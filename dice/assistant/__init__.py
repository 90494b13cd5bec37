"""The assistant service: masks -> prompts -> engine -> validator -> ranking, used by the CLI and dice-lsp."""

from dice.assistant.ranking import rank, rank_key
from dice.assistant.service import AssistantService
from dice.assistant.settings import SETTINGS, AssistantSettings
from dice.assistant.types import (
    Candidate,
    DocumentCompletion,
    MaskCompletion,
    ModelInfo,
    Progress,
    RankedProgram,
)

__all__ = [
    "SETTINGS",
    "AssistantService",
    "AssistantSettings",
    "Candidate",
    "DocumentCompletion",
    "MaskCompletion",
    "ModelInfo",
    "Progress",
    "RankedProgram",
    "rank",
    "rank_key",
]
