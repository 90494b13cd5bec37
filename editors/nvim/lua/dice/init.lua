-- DICE kernel assistant for Neovim >= 0.11: starts `dice-lsp` for CUDA buffers and adds commands.
--
--   require("dice").setup({ settings = { modelPath = "", candidates = 3 } })
--
-- Commands: :DiceSuggest (ghost text at the cursor; :DiceAccept or <M-CR> inserts it, :DiceNext cycles),
-- :DiceFillAllMasks, :DiceFillMask, :DiceValidate, :DiceGenerate (on a KernelBench .py reference).
-- Neovim 0.11 has no native inline completion, so :DiceSuggest sends textDocument/inlineCompletion itself.
local M = {}

M.status = { state = "stopped" } -- the last dice/status notification, for statuslines

local ns = vim.api.nvim_create_namespace("dice-suggestion")
local suggestion = nil -- { bufnr, items, index, changedtick }

local defaults = {
  cmd = { "dice-lsp" },
  filetypes = { "cuda", "cpp", "python" },
  -- The `dice` settings object (keys as in VS Code's dice.<key>); sent as initializationOptions and
  -- through workspace/didChangeConfiguration.
  settings = {},
  keymaps = true,
}

local function client_for(bufnr)
  return vim.lsp.get_clients({ name = "dice", bufnr = bufnr or 0 })[1]
end

local function clear()
  if suggestion then
    pcall(vim.api.nvim_buf_clear_namespace, suggestion.bufnr, ns, 0, -1)
  end
  suggestion = nil
end

local function show(index)
  local s = suggestion
  if not s then
    return
  end
  vim.api.nvim_buf_clear_namespace(s.bufnr, ns, 0, -1)
  s.index = (index - 1) % #s.items + 1
  local item = s.items[s.index]
  local lines = vim.split(item.insertText, "\n", { plain = true })
  local start = item.range.start
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], "Comment" } }
  end
  vim.api.nvim_buf_set_extmark(s.bufnr, ns, start.line, 0, {
    virt_text = { { lines[1], "Comment" }, { string.format("  [DICE %d/%d]", s.index, #s.items), "NonText" } },
    virt_text_pos = "eol",
    virt_lines = #virt_lines > 0 and virt_lines or nil,
  })
end

--- Ask the server for inline completions at the cursor; returns the items (also shown as ghost text).
function M.suggest(opts)
  opts = opts or {}
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    vim.notify("DICE: dice-lsp is not attached to this buffer", vim.log.levels.WARN)
    return {}
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = opts.automatic and 2 or 1 }
  local responses = vim.lsp.buf_request_sync(bufnr, "textDocument/inlineCompletion", params, opts.timeout_ms or 60000)
  local items = {}
  for _, response in pairs(responses or {}) do
    local result = response.result or {}
    for _, item in ipairs(result.items or result) do
      items[#items + 1] = item
    end
  end
  clear()
  if #items > 0 then
    suggestion = { bufnr = bufnr, items = items, index = 1, changedtick = vim.b[bufnr].changedtick }
    show(1)
  elseif not opts.quiet then
    vim.notify("DICE: no suggestion here", vim.log.levels.INFO)
  end
  return items
end

function M.next()
  if suggestion then
    show(suggestion.index + 1)
  end
end

--- Insert the shown suggestion (replacing its range, e.g. the mask comment).
function M.accept()
  local s = suggestion
  if not s or vim.b[s.bufnr].changedtick ~= s.changedtick then
    clear()
    return false
  end
  local item = s.items[s.index]
  local client = client_for(s.bufnr)
  clear()
  vim.lsp.util.apply_text_edits({ { range = item.range, newText = item.insertText } }, s.bufnr, client.offset_encoding)
  return true
end

local function exec(command, with_position, handler)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    vim.notify("DICE: dice-lsp is not attached to this buffer", vim.log.levels.WARN)
    return
  end
  local arguments = { vim.uri_from_bufnr(bufnr) }
  if with_position then
    local pos = vim.lsp.util.make_position_params(0, client.offset_encoding).position
    arguments[2] = pos
  end
  client:exec_cmd({ title = command, command = command, arguments = arguments }, { bufnr = bufnr }, handler)
end

function M.fill_all_masks(handler)
  exec("dice.fillAllMasks", false, handler)
end

function M.fill_mask(handler)
  exec("dice.fillMask", true, handler)
end

function M.validate(handler)
  exec("dice.validateKernel", false, handler)
end

function M.generate(handler)
  exec("dice.generateKernel", false, handler)
end

function M.statusline()
  local s = M.status
  if s.state == "stopped" then
    return ""
  end
  return "DICE " .. s.state .. (s.model and (" · " .. s.model) or "")
end

function M.setup(opts)
  opts = vim.tbl_deep_extend("force", defaults, opts or {})
  vim.filetype.add({ extension = { cu = "cuda", cuh = "cuda" } })
  vim.lsp.config("dice", {
    cmd = opts.cmd,
    filetypes = opts.filetypes,
    root_markers = { ".git", "pyproject.toml" },
    init_options = opts.settings,
    settings = { dice = opts.settings },
    -- .py buffers only matter for "Generate CUDA kernel"; the server ignores them otherwise.
    handlers = {
      ["dice/status"] = function(_, result)
        M.status = result or { state = "stopped" }
        vim.api.nvim_exec_autocmds("User", { pattern = "DiceStatus", modeline = false })
      end,
    },
  })
  vim.lsp.enable("dice")

  local command = vim.api.nvim_create_user_command
  command("DiceSuggest", function()
    M.suggest()
  end, { desc = "DICE: suggest a fill at the cursor" })
  command("DiceNext", M.next, { desc = "DICE: next suggestion" })
  command("DiceAccept", function()
    M.accept()
  end, { desc = "DICE: insert the suggestion" })
  command("DiceFillAllMasks", function()
    M.fill_all_masks()
  end, { desc = "DICE: fill all masks" })
  command("DiceFillMask", function()
    M.fill_mask()
  end, { desc = "DICE: fill the mask under the cursor" })
  command("DiceValidate", function()
    M.validate()
  end, { desc = "DICE: validate this kernel" })
  command("DiceGenerate", function()
    M.generate()
  end, { desc = "DICE: generate a CUDA kernel from this PyTorch reference" })

  local group = vim.api.nvim_create_augroup("dice", { clear = true })
  vim.api.nvim_create_autocmd({ "TextChanged", "TextChangedI", "BufLeave" }, { group = group, callback = clear })
  if opts.keymaps then
    vim.keymap.set({ "n", "i" }, "<M-CR>", function()
      if not M.accept() then
        M.suggest()
      end
    end, { desc = "DICE: suggest / accept" })
    vim.keymap.set({ "n", "i" }, "<M-]>", M.next, { desc = "DICE: next suggestion" })
  end
end

return M
