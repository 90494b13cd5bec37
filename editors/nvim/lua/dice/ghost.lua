-- Drawing one inline-completion item as ghost text (extmarks in one namespace), with its verdict label.
--
-- An insertion at the cursor is drawn inline where it would go; an item that replaces a mask comment is
-- drawn after the line. Further lines of a multi-line item are virtual lines below. The label (the item's
-- command title, e.g. "compiled ✓ · not run") follows the first line, dimmed, or in a warning colour when
-- the candidate failed validation (shown only because nothing passed).
local M = {}

M.ns = vim.api.nvim_create_namespace("dice-suggestion")

--- Highlight groups (all `default`, so a colorscheme or the user can override them).
function M.define_highlights()
  local set = vim.api.nvim_set_hl
  set(0, "DiceSuggestion", { link = "Comment", default = true })
  set(0, "DiceLabel", { link = "NonText", default = true })
  set(0, "DiceLabelFailed", { link = "DiagnosticWarn", default = true })
end

--- The verdict label of an item and whether its candidate is usable (passed validation).
--- Items from servers without labels (or served by typing through) have none.
function M.label(item)
  local command = item.command
  if type(command) ~= "table" then
    return nil, true
  end
  local arg = type(command.arguments) == "table" and command.arguments[1] or nil
  arg = type(arg) == "table" and arg or {}
  local title = type(command.title) == "string" and command.title ~= "" and command.title
    or (type(arg.label) == "string" and arg.label ~= "" and arg.label)
    or nil
  local failed = arg.usable == false or (title ~= nil and title:find("✗", 1, true) ~= nil)
  return title, not failed
end

--- The item's text (a plain string; snippet objects give their value).
function M.text(item)
  local text = item.insertText
  if type(text) == "table" then
    text = text.value
  end
  return type(text) == "string" and text:gsub("\r\n", "\n") or ""
end

--- Byte column of an LSP `character` on `line` of `bufnr` in `encoding`.
function M.byte_col(bufnr, line, character, encoding)
  local text = vim.api.nvim_buf_get_lines(bufnr, line, line + 1, false)[1] or ""
  if encoding == "utf-8" then
    return math.min(character, #text)
  end
  local ok, col = pcall(vim.str_byteindex, text, encoding or "utf-16", character, false)
  return ok and math.min(col, #text) or #text
end

function M.clear(bufnr)
  if bufnr and vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

local function display(bufnr, text)
  local spaces = string.rep(" ", vim.bo[bufnr].tabstop > 0 and vim.bo[bufnr].tabstop or 8)
  return (text:gsub("\t", spaces))
end

--- Draws `item` (the `index`-th of `count`) in `bufnr`; `position` is where it was asked for (used when
--- the item has no range). Returns the extmark ids.
function M.draw(bufnr, item, index, count, position, encoding)
  M.clear(bufnr)
  local lines = vim.split(M.text(item), "\n", { plain = true })
  local range = item.range or { start = position, ["end"] = position }
  local row = range.start.line
  local label, usable = M.label(item)
  local tag = (label or "DICE") .. (count > 1 and string.format(" [%d/%d]", index, count) or "")
  local label_chunk = { "  " .. tag, usable and "DiceLabel" or "DiceLabelFailed" }

  local ids = {}
  local eol = {}
  local first = display(bufnr, lines[1])
  local single = range.start.line == range["end"].line
  local scol = M.byte_col(bufnr, row, range.start.character, encoding)
  local ecol = single and M.byte_col(bufnr, row, range["end"].character, encoding) or scol
  if single and scol == ecol then
    -- an insertion (at the cursor): the first line goes where it would be inserted
    if first ~= "" then
      ids[#ids + 1] = vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, scol, {
        virt_text = { { first, "DiceSuggestion" } },
        virt_text_pos = "inline",
        hl_mode = "combine",
      })
    end
  else
    -- replaces a mask comment: shown after the line
    eol[#eol + 1] = { " " .. first, "DiceSuggestion" }
  end
  eol[#eol + 1] = label_chunk
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { display(bufnr, lines[i]), "DiceSuggestion" } }
  end
  ids[#ids + 1] = vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, 0, {
    virt_text = eol,
    virt_text_pos = "eol",
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = "combine",
  })
  return ids
end

return M
