"""CUDA source intelligence: masks, functions, ``dice-spec`` blocks, splicing and device-code extraction.

Pure functions over ``.cu``/``.cuh`` text, built on tree-sitter-cuda: no model, no GPU, no file I/O. Byte
offsets always refer to the UTF-8 encoding of the text; LSP positions are 0-based lines and UTF-16 code units
(:class:`PositionIndex` is the one place that converts between them).
"""

from dice.cuda_source._syntax import parse_bytes
from dice.cuda_source.device_code import DeviceCode, extract_device_code
from dice.cuda_source.document import (
    CudaDocument,
    DiceSpec,
    FunctionInfo,
    FunctionKind,
    MalformedMask,
    Mask,
    function_at,
    parse_document,
)
from dice.cuda_source.positions import Position, PositionIndex, Range, encode_text, utf16_length
from dice.cuda_source.splice import SpliceResult, TextEdit, splice
from dice.cuda_source.window import hole_context, line_aligned_span, trim_context

__all__ = [
    "CudaDocument",
    "DeviceCode",
    "DiceSpec",
    "FunctionInfo",
    "FunctionKind",
    "MalformedMask",
    "Mask",
    "Position",
    "PositionIndex",
    "Range",
    "SpliceResult",
    "TextEdit",
    "encode_text",
    "extract_device_code",
    "function_at",
    "hole_context",
    "line_aligned_span",
    "parse_bytes",
    "parse_document",
    "splice",
    "trim_context",
    "utf16_length",
]
