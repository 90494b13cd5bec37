-- A minimal Neovim (>= 0.11) config for DICE: copy this folder to ~/.config/nvim/ (or add it to your
-- runtimepath) and start `nvim kernel.cu`. `dice-lsp` must be on PATH (`pip install dice-cuda`).
vim.opt.runtimepath:prepend(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p:h"))

require("dice").setup({
  -- The `dice` settings (same keys as VS Code's dice.<key>; see docs/INTERNALS.md).
  settings = {
    modelPath = vim.env.DICE_MODEL or "", -- "" = the embedded model
    device = "auto",
    candidates = 3,
    validationLevel = "run",
  },
})

vim.o.statusline = "%f %m%=%{v:lua.require'dice'.statusline()} %l:%c"
