"""lsp_server package."""
