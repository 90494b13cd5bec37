-- A minimal config to try the DICE plugin without touching yours (and what tests/lsp/test_nvim.py runs):
--
--   nvim -u editors/nvim/minimal_init.lua examples/softmax_rows.cu
--
-- It puts this folder on 'runtimepath' and calls require("dice").setup{}. Environment (all optional):
--   DICE_MODEL          checkpoint folder ("" or unset: the embedded model)
--   DICE_LSP_CMD        the server command as a JSON list (default ["dice-lsp"])
--   DICE_NVIM_SETTINGS  a JSON object merged into the `dice` settings (docs/INTERNALS.md)
-- Your own config does this with a plugin manager instead; see editors/nvim/README.md.
local here = vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p:h")
vim.opt.runtimepath:prepend(here)

local function json_env(name)
  local value = vim.env[name]
  return value and value ~= "" and vim.json.decode(value) or nil
end

require("dice").setup({
  cmd = json_env("DICE_LSP_CMD"),
  settings = vim.tbl_extend("force", {
    modelPath = vim.env.DICE_MODEL or "",
    device = "auto",
    candidates = 3,
    validationLevel = "run",
  }, json_env("DICE_NVIM_SETTINGS") or {}),
})

vim.o.statusline = "%f %m%=%{v:lua.require'dice'.statusline()} %l:%c"
