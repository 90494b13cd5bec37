"""dice-lsp: the DICE language server (pygls 2, LSP 3.18) for .cu/.cuh files."""

__version__ = "0.1.0"
