-- Driven by tests/lsp/test_nvim.py: a headless Neovim with the DICE plugin (editors/nvim/minimal_init.lua)
-- edits files through dice-lsp and writes what it saw to $DICE_NVIM_OUT (JSON). Every wait is on a
-- condition (vim.wait with a predicate, or an autocmd), with a limit; none is a fixed sleep.
--
-- $DICE_NVIM_SCENARIO: "main" (attach, async inline request, cancellation, stale answers, Fill all masks,
-- on-demand start for a KernelBench .py, automatic suggestions in insert mode) or "failing" (an inline
-- request where no candidate compiles).
local WAIT_MS = 120000
local out = { notifications = {} }
local esc = vim.keycode("<Esc>")

local function finish(err)
  out.error = err
  local f = assert(io.open(vim.env.DICE_NVIM_OUT, "w"))
  f:write(vim.json.encode(out))
  f:close()
  vim.cmd("qa!")
end

-- what the plugin tells the user
vim.notify = function(msg, level)
  table.insert(out.notifications, { message = msg, level = level or vim.log.levels.INFO })
end

local function wait(what, predicate)
  assert(vim.wait(WAIT_MS, predicate, 10), "timed out waiting for " .. what)
end

local function attached(bufnr)
  return #vim.lsp.get_clients({ name = "dice", bufnr = bufnr })
end

local function marks(bufnr)
  local dice = require("dice")
  return vim.tbl_map(function(m)
    local d = m[4]
    return {
      row = m[2],
      col = m[3],
      pos = d.virt_text_pos,
      virt_text = d.virt_text or {},
      virt_lines = d.virt_lines and #d.virt_lines or 0,
    }
  end, vim.api.nvim_buf_get_extmarks(bufnr, dice.namespace, 0, -1, { details = true }))
end

--- Sends an inline request at the cursor; returns what the callback got and whether the call returned
--- before the answer (it must: the request is asynchronous).
local function suggest_and_wait(opts)
  local dice = require("dice")
  local got
  opts = vim.tbl_extend("force", opts or {}, {
    callback = function(items, info)
      got = { items = items, reason = info.reason }
    end,
  })
  local sent = dice.suggest(opts)
  local returned_first = sent and got == nil and dice.pending() ~= nil
  wait("an inline answer", function()
    return got ~= nil
  end)
  got.returned_first = returned_first
  return got
end

local function open_cuda()
  local dice = require("dice")
  vim.cmd.edit(vim.env.DICE_NVIM_FILE)
  local bufnr = vim.api.nvim_get_current_buf()
  out.filetype = vim.bo[bufnr].filetype
  wait("dice-lsp to attach", function()
    return attached(bufnr) > 0
  end)
  wait("a ready status", function()
    return dice.status.state == "ready" or dice.status.state == "error"
  end)
  out.status = dice.status
  out.offset_encoding = vim.lsp.get_clients({ name = "dice", bufnr = bufnr })[1].offset_encoding
  wait("the mask diagnostics", function()
    return #vim.diagnostic.get(bufnr) > 0
  end)
  out.diagnostics = vim.tbl_map(function(d)
    return { lnum = d.lnum, col = d.col, severity = d.severity, source = d.source }
  end, vim.diagnostic.get(bufnr))
  return bufnr
end

local function at_first_mask(bufnr)
  local first = vim.diagnostic.get(bufnr)[1]
  vim.api.nvim_win_set_cursor(0, { first.lnum + 1, first.col })
end

local function other_buffers(cuda)
  local dice = require("dice")
  -- Markdown and plain Python: never attached
  out.others = {}
  for _, name in ipairs({ "DICE_NVIM_MD", "DICE_NVIM_PY" }) do
    vim.cmd.edit(vim.env[name])
    local b = vim.api.nvim_get_current_buf()
    out.others[name] = { filetype = vim.bo[b].filetype, attached = attached(b) }
  end
  -- a KernelBench reference: attached on demand by :DiceGenerate
  vim.cmd.edit(vim.env.DICE_NVIM_REF)
  local ref = vim.api.nvim_get_current_buf()
  out.reference = { filetype = vim.bo[ref].filetype, attached_before = attached(ref) }
  local done
  dice.generate(function(err, result)
    done = { error = err and err.message or vim.NIL, result = result }
  end)
  wait(":DiceGenerate to answer", function()
    return done ~= nil
  end)
  out.reference.attached_after = attached(ref)
  out.reference.generate = done
  vim.cmd.buffer(cuda)
end

--- Insert mode, for real: the keys are typed (feedkeys "x!" keeps Neovim in its insert loop, where
--- TextChangedI fires and timers run), the plugin's debounce asks on its own and the ghost text appears;
--- one more key clears it (and a new one comes); the accept key (<M-CR>) inserts it; <Esc> ends the phase.
local function automatic()
  local dice = require("dice")
  local auto = {}
  out.automatic = auto
  vim.cmd.edit(vim.env.DICE_NVIM_AUTO_FILE)
  local bufnr = vim.api.nvim_get_current_buf()
  wait("dice-lsp to attach to the second .cu file", function()
    return attached(bufnr) > 0
  end)
  vim.api.nvim_win_set_cursor(0, { tonumber(vim.env.DICE_NVIM_AUTO_LINE), 0 })

  local function automatic_suggestion()
    return vim.wait(WAIT_MS, function()
      local s = dice.current()
      return s ~= nil and s.automatic
    end, 10)
  end
  -- each step runs inside the insert loop; an error ends the phase
  local function step(fn)
    return function()
      local ok, err = pcall(fn)
      if not ok then
        auto.error = tostring(err)
        vim.api.nvim_feedkeys(esc, "n", false)
      end
    end
  end
  local function once(event, fn)
    vim.api.nvim_create_autocmd(event, { buffer = bufnr, once = true, callback = step(fn) })
  end
  local function text()
    return table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n") .. "\n"
  end

  once("InsertLeave", function()
    auto.pending_after_leave = dice.pending() ~= nil
  end)
  vim.defer_fn(
    step(function() -- after the keys below were typed
      auto.mode = vim.api.nvim_get_mode().mode
      auto.shown = automatic_suggestion()
      assert(auto.shown, "no automatic suggestion")
      auto.mode_when_shown = vim.api.nvim_get_mode().mode
      auto.marks = marks(bufnr)
      auto.cursor = vim.api.nvim_win_get_cursor(0)
      auto.line = vim.api.nvim_get_current_line()
      auto.items = dice.current().items
      once("TextChangedI", function()
        auto.marks_after_typing = #marks(bufnr)
        auto.shown_again = automatic_suggestion()
        assert(auto.shown_again, "no automatic suggestion after typing on")
        local s = dice.current()
        auto.before_accept = text()
        auto.accepting = s.items[s.index]
        once("TextChangedI", function()
          auto.after_accept = text()
          auto.marks_after_accept = #marks(bufnr)
          auto.accepted = dice.last_accepted
          vim.api.nvim_feedkeys(esc, "n", false)
        end)
        vim.api.nvim_feedkeys(vim.keycode("<M-CR>"), "m", false) -- the plugin's accept key
      end)
      vim.api.nvim_feedkeys("/", "n", false) -- one more key while the ghost text is shown
    end),
    0
  )
  vim.api.nvim_feedkeys(vim.keycode("A<CR>int j"), "tx!", false)
  -- back in normal mode: <Esc> was typed
  auto.marks_after_leave = #marks(bufnr)
  auto.final_mode = vim.api.nvim_get_mode().mode
end

local function main()
  local dice = require("dice")
  local bufnr = open_cuda()
  other_buffers(bufnr)

  -- an inline request at the first mask: asynchronous, drawn as ghost text with its label
  at_first_mask(bufnr)
  local got = suggest_and_wait()
  out.items = got.items
  out.reason = got.reason
  out.returned_first = got.returned_first
  out.marks = marks(bufnr)
  out.suggestion_status = dice.suggestion_status[bufnr]
  out.statusline = dice.statusline()

  -- a newer request supersedes the older one
  local older
  dice.suggest({
    callback = function(_, info)
      older = info.reason
    end,
  })
  local newer = suggest_and_wait()
  out.supersede = { older = older, newer = newer.reason }

  -- an answer for a buffer that changed meanwhile is dropped (the text ends up as it was)
  local stale
  dice.suggest({
    callback = function(_, info)
      stale = info.reason
    end,
  })
  vim.api.nvim_buf_set_lines(bufnr, -1, -1, false, { "// typed while waiting" })
  vim.api.nvim_buf_set_lines(bufnr, -2, -1, false, {})
  wait("the stale answer", function()
    return stale ~= nil
  end)
  out.stale = { reason = stale, marks = #marks(bufnr) }

  -- "Fill all masks": the server answers with workspace/applyEdit, Neovim applies it
  local tick = vim.b[bufnr].changedtick
  local done = false
  dice.fill_all_masks(function(e, result)
    out.fill_error = e and e.message or nil
    out.fill_result = result
    done = true
  end)
  wait("fillAllMasks", function()
    return done
  end)
  out.changed = vim.b[bufnr].changedtick ~= tick
  out.text = table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n") .. "\n"

  automatic()
end

local function failing()
  local dice = require("dice")
  local bufnr = open_cuda()
  at_first_mask(bufnr)
  local got = suggest_and_wait()
  out.items = got.items
  out.reason = got.reason
  out.marks = marks(bufnr)
  out.suggestion_status = dice.suggestion_status[bufnr]
  out.statusline = dice.statusline()
end

local scenarios = { main = main, failing = failing }
local ok, err = pcall(scenarios[vim.env.DICE_NVIM_SCENARIO or "main"])
finish(ok and vim.NIL or tostring(err))
