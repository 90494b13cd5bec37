-- Driven by tests/lsp/test_nvim.py: a headless Neovim with editors/nvim's config edits a .cu file through
-- dice-lsp and writes what it saw to $DICE_NVIM_OUT (JSON). Every wait is on a condition, with a limit.
local out = {}
local function finish(err)
  out.error = err
  local f = assert(io.open(vim.env.DICE_NVIM_OUT, "w"))
  f:write(vim.json.encode(out))
  f:close()
  vim.cmd("qa!")
end

local ok, err = pcall(function()
  local dice = require("dice")
  vim.cmd.edit(vim.env.DICE_NVIM_FILE)
  local bufnr = vim.api.nvim_get_current_buf()
  out.filetype = vim.bo[bufnr].filetype
  assert(vim.wait(60000, function()
    return #vim.lsp.get_clients({ name = "dice", bufnr = bufnr }) > 0
  end, 20), "dice-lsp did not attach")
  assert(vim.wait(120000, function()
    return dice.status.state == "ready" or dice.status.state == "error"
  end, 20), "no ready status")
  out.status = dice.status
  local client = vim.lsp.get_clients({ name = "dice", bufnr = bufnr })[1]
  out.offset_encoding = client.offset_encoding

  -- the mask diagnostics arrive
  assert(vim.wait(60000, function()
    return #vim.diagnostic.get(bufnr) > 0
  end, 20), "no diagnostics")
  out.diagnostics = vim.tbl_map(function(d)
    return { lnum = d.lnum, col = d.col, severity = d.severity, source = d.source }
  end, vim.diagnostic.get(bufnr))

  -- inline completion at the first mask
  local first = vim.diagnostic.get(bufnr)[1]
  vim.api.nvim_win_set_cursor(0, { first.lnum + 1, first.col })
  out.items = dice.suggest({ timeout_ms = 120000 })
  out.ghost = #vim.api.nvim_buf_get_extmarks(bufnr, vim.api.nvim_create_namespace("dice-suggestion"), 0, -1, {})

  -- "Fill all masks": the server answers with workspace/applyEdit, Neovim applies it
  local tick = vim.b[bufnr].changedtick
  local done = false
  dice.fill_all_masks(function(e, result)
    out.fill_error = e and e.message or nil
    out.fill_result = result
    done = true
  end)
  assert(vim.wait(120000, function()
    return done
  end, 20), "fillAllMasks did not answer")
  out.changed = vim.b[bufnr].changedtick ~= tick
  out.text = table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n") .. "\n"
end)
finish(ok and vim.NIL or tostring(err))
