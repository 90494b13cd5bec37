-- DICE kernel assistant for Neovim >= 0.11: starts `dice-lsp` for CUDA buffers, shows its validated
-- suggestions as ghost text with their verdicts, and adds commands. A plugin: add editors/nvim to your
-- plugin manager (or runtimepath) and call
--
--   require("dice").setup({ settings = { modelPath = "", candidates = 3 } })
--
-- Neovim 0.11 has no native inline completion, so this module sends textDocument/inlineCompletion itself,
-- asynchronously: a newer request cancels the older one, and an answer for a buffer that changed meanwhile
-- is dropped. See editors/nvim/README.md.
local ghost = require("dice.ghost")

local M = {}

M.status = { state = "stopped" } -- the last dice/status notification, for statuslines
--- bufnr -> the last dice/suggestionStatus for that buffer (forgotten on the next edit)
M.suggestion_status = {}
--- the arguments of the last accepted item's dice.suggestionAccepted command ({uri, label, usable})
M.last_accepted = nil
M.namespace = ghost.ns

local REQUEST_CANCELLED = -32800
local INVOKED, AUTOMATIC = 1, 2 -- InlineCompletionTriggerKind

local defaults = {
  cmd = { "dice-lsp" },
  -- The `dice` settings object (keys as in VS Code's dice.<key>, docs/INTERNALS.md); sent as
  -- initializationOptions and through workspace/didChangeConfiguration.
  settings = {},
  -- true: the default keys below; false: none; a table: overrides (a key set to false is not mapped).
  keymaps = true,
  filetypes = { "cuda" },
  root_markers = { ".git", "pyproject.toml" },
  debounce_ms = 150, -- automatic suggestions: wait this long after the last keystroke in insert mode
  notify = true, -- vim.notify the reason when no candidate is usable (always in statusline())
}

local default_keys = {
  accept = "<M-CR>", -- insert the shown suggestion; asks for one when none is shown
  next = "<M-]>",
  prev = "<M-[>",
  dismiss = "<C-]>", -- insert mode only; falls through to the key when nothing is shown
}

local config = vim.deepcopy(defaults)
local shown = nil -- { bufnr, client_id, items, index, changedtick, cursor, position, automatic, insert }
local pending = nil -- the inline request in flight: { bufnr, client_id, id, tick, cursor, automatic, callback }
local timers = {} -- bufnr -> debounce timer of automatic requests
local notified = {} -- bufnr -> key of the last message notified for an automatic request

local function is_set(v)
  return v ~= nil and v ~= vim.NIL
end

local function client_for(bufnr)
  return vim.lsp.get_clients({ name = "dice", bufnr = bufnr })[1]
end

local function insert_mode()
  local mode = vim.api.nvim_get_mode().mode
  return mode:sub(1, 1) == "i" or mode:sub(1, 1) == "R"
end

local function automatic_enabled()
  return config.settings.automaticTrigger ~= false
end

local function redraw_status()
  pcall(vim.cmd.redrawstatus)
end

local function user_event(pattern, data)
  vim.api.nvim_exec_autocmds("User", { pattern = pattern, modeline = false, data = data })
end

--- The request in flight, if any (for statuslines and tests).
function M.pending()
  return pending and { bufnr = pending.bufnr, automatic = pending.automatic } or nil
end

--- The suggestion shown, if any: { bufnr, items, index, automatic }.
function M.current()
  return shown and { bufnr = shown.bufnr, items = shown.items, index = shown.index, automatic = shown.automatic }
    or nil
end

local function settle(entry, items, reason)
  if entry.done then
    return
  end
  entry.done = true
  if entry.callback then
    entry.callback(items, { reason = reason, automatic = entry.automatic })
  end
end

--- Cancels the inline request in flight (its callback gets `reason`, "cancelled" by default).
function M.cancel(reason)
  local entry = pending
  if not entry then
    return
  end
  pending = nil
  local client = vim.lsp.get_client_by_id(entry.client_id)
  if client and entry.id then
    pcall(client.cancel_request, client, entry.id)
  end
  settle(entry, {}, reason or "cancelled")
end

local function clear()
  if shown then
    ghost.clear(shown.bufnr)
  end
  shown = nil
end

--- Removes the ghost text and cancels the request in flight.
function M.dismiss()
  local had = shown ~= nil or pending ~= nil
  M.cancel()
  clear()
  return had
end

local function draw()
  local s = shown
  local client = vim.lsp.get_client_by_id(s.client_id)
  ghost.draw(s.bufnr, s.items[s.index], s.index, #s.items, s.position, client and client.offset_encoding)
  user_event("DiceSuggestion", { bufnr = s.bufnr, index = s.index, count = #s.items, automatic = s.automatic })
end

local function collect(result)
  local items = {}
  if type(result) ~= "table" then
    return items
  end
  for _, item in ipairs(result.items or result) do
    if type(item) == "table" and ghost.text(item) ~= "" then
      items[#items + 1] = item
    end
  end
  return items
end

local function on_response(entry, err, result)
  if pending ~= entry then
    return settle(entry, {}, "superseded")
  end
  pending = nil
  if err then
    if err.code ~= REQUEST_CANCELLED and not entry.automatic then
      vim.notify("DICE: " .. tostring(err.message or err), vim.log.levels.ERROR)
    end
    return settle(entry, {}, err.code == REQUEST_CANCELLED and "cancelled" or "error")
  end
  local bufnr = entry.bufnr
  if not vim.api.nvim_buf_is_valid(bufnr) or vim.b[bufnr].changedtick ~= entry.tick then
    if shown and shown.bufnr == bufnr and vim.b[bufnr].changedtick ~= shown.changedtick then
      clear()
    end
    return settle(entry, {}, "stale") -- the buffer changed: the answer is for text that is gone
  end
  if entry.automatic then
    local cursor = vim.api.nvim_win_get_cursor(0)
    local here = vim.api.nvim_get_current_buf() == bufnr and cursor[1] == entry.cursor[1] and cursor[2] == entry.cursor[2]
    if not here or not insert_mode() then
      return settle(entry, {}, "stale")
    end
  end
  local items = collect(result)
  clear()
  if #items == 0 then
    if not entry.automatic and not entry.explained and not entry.quiet then
      vim.notify("DICE: no suggestion here", vim.log.levels.INFO)
    end
    return settle(entry, items, "empty")
  end
  shown = {
    bufnr = bufnr,
    client_id = entry.client_id,
    items = items,
    index = 1,
    changedtick = entry.tick,
    cursor = entry.cursor,
    position = entry.position,
    automatic = entry.automatic,
    insert = insert_mode(),
  }
  draw()
  settle(entry, items, "shown")
end

--- Asks the server for suggestions at the cursor, asynchronously; they are drawn as ghost text when they
--- arrive. opts: automatic (triggerKind Automatic: one item), quiet (no "no suggestion" message),
--- callback(items, {reason = "shown"|"empty"|"stale"|"superseded"|"cancelled"|"error"|"no client"}).
--- Returns true when a request was sent.
function M.suggest(opts)
  opts = opts or {}
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  local entry = { bufnr = bufnr, automatic = opts.automatic or false, quiet = opts.quiet, callback = opts.callback }
  if not client then
    if not entry.automatic then
      vim.notify("DICE: dice-lsp is not attached to this buffer", vim.log.levels.WARN)
    end
    settle(entry, {}, "no client")
    return false
  end
  M.cancel("superseded") -- a newer request replaces the older one
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = entry.automatic and AUTOMATIC or INVOKED }
  entry.client_id = client.id
  entry.tick = vim.b[bufnr].changedtick
  entry.cursor = vim.api.nvim_win_get_cursor(0)
  entry.position = params.position
  pending = entry
  local ok, id = client:request("textDocument/inlineCompletion", params, function(err, result)
    on_response(entry, err, result)
  end, bufnr)
  if not ok then
    if pending == entry then
      pending = nil
    end
    settle(entry, {}, "error")
    return false
  end
  if not entry.done then
    entry.id = id
  end
  return true
end

local function cycle(step)
  if not shown then
    return M.suggest()
  end
  if vim.b[shown.bufnr].changedtick ~= shown.changedtick then
    clear()
    return false
  end
  shown.index = (shown.index - 1 + step) % #shown.items + 1
  draw()
  return true
end

function M.next()
  return cycle(1)
end

function M.prev()
  return cycle(-1)
end

--- Inserts the shown suggestion (replacing its range, e.g. the mask comment) and runs its command.
function M.accept()
  local s = shown
  if not s then
    return false
  end
  local client = vim.lsp.get_client_by_id(s.client_id)
  if not client or not vim.api.nvim_buf_is_valid(s.bufnr) or vim.b[s.bufnr].changedtick ~= s.changedtick then
    clear()
    return false
  end
  local item = s.items[s.index]
  local text = ghost.text(item)
  local range = item.range or { start = s.position, ["end"] = s.position }
  clear()
  M.cancel()
  local start_col = ghost.byte_col(s.bufnr, range.start.line, range.start.character, client.offset_encoding)
  vim.lsp.util.apply_text_edits({ { range = range, newText = text } }, s.bufnr, client.offset_encoding)
  if vim.api.nvim_get_current_buf() == s.bufnr then
    local lines = vim.split(text, "\n", { plain = true })
    local row = range.start.line + #lines
    local col = (#lines == 1 and start_col or 0) + #lines[#lines]
    pcall(vim.api.nvim_win_set_cursor, 0, { row, col })
  end
  if type(item.command) == "table" and type(item.command.command) == "string" then
    client:exec_cmd(item.command, { bufnr = s.bufnr })
  end
  return true
end

-- ------------------------------------------------------------------ notifications from the server

local function buffer_of(client, uri)
  for bufnr in pairs(client and client.attached_buffers or {}) do
    if vim.uri_from_bufnr(bufnr) == uri then
      return bufnr
    end
  end
end

local function on_suggestion_status(_, result, ctx)
  if type(result) ~= "table" then
    return
  end
  local bufnr = buffer_of(vim.lsp.get_client_by_id(ctx.client_id), result.uri)
  if not bufnr then
    return
  end
  if not is_set(result.message) then
    result.message = nil
  end
  M.suggestion_status[bufnr] = result
  local entry = pending and pending.bufnr == bufnr and pending or nil
  if result.message then
    local pos = type(result.position) == "table" and result.position or {}
    local key = string.format("%s:%s:%s", tostring(pos.line), tostring(pos.character), result.message)
    -- an explicit request always says why; automatic ones once per position and message
    local automatic = entry == nil or entry.automatic
    if entry then
      entry.explained = true
    end
    if config.notify and (not automatic or notified[bufnr] ~= key) then
      notified[bufnr] = key
      vim.notify("DICE: " .. result.message, vim.log.levels.WARN)
    end
  end
  user_event("DiceSuggestionStatus", { bufnr = bufnr, status = result })
  redraw_status()
end

local function on_status(_, result)
  M.status = type(result) == "table" and result or { state = "stopped" }
  user_event("DiceStatus", M.status)
  redraw_status()
end

local function on_accepted(command)
  local arg = type(command.arguments) == "table" and command.arguments[1] or nil
  M.last_accepted = type(arg) == "table" and arg or { label = command.title }
  user_event("DiceAccepted", M.last_accepted)
end

function M.statusline()
  local s = M.status
  if s.state == "stopped" then
    return ""
  end
  local text = "DICE " .. s.state .. (is_set(s.model) and (" · " .. s.model) or "")
  local last = M.suggestion_status[vim.api.nvim_get_current_buf()]
  if last and last.message then
    local message = last.message
    if vim.fn.strchars(message) > 60 then
      message = vim.fn.strcharpart(message, 0, 59) .. "…"
    end
    text = text .. " · ✗ " .. message
  end
  return text
end

-- ------------------------------------------------------------------ commands

local function kernelbench_reference(bufnr)
  local model, inputs = false, false
  for _, line in ipairs(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)) do
    model = model or line:match("^class%s+Model%s*%(%s*nn%.Module%s*%)%s*:") ~= nil
      or line:match("^class%s+Model%s*%(%s*torch%.nn%.Module%s*%)%s*:") ~= nil
    inputs = inputs or line:match("^def%s+get_inputs%s*%(") ~= nil
  end
  return model and inputs
end

--- Calls fn(client) with the dice client of `bufnr`. A KernelBench reference (.py) gets one on demand
--- (`on_demand`): the server starts (or the running one attaches) for that buffer only.
local function with_client(bufnr, on_demand, fn)
  local client = client_for(bufnr)
  if client then
    return fn(client)
  end
  if not (on_demand and vim.bo[bufnr].filetype == "python" and kernelbench_reference(bufnr)) then
    local hint = vim.bo[bufnr].filetype == "python"
        and " (a KernelBench reference defines class Model(nn.Module) and get_inputs())"
      or ""
    vim.notify("DICE: dice-lsp is not attached to this buffer" .. hint, vim.log.levels.WARN)
    return
  end
  local cfg = vim.deepcopy(vim.lsp.config.dice)
  if type(cfg.root_dir) ~= "string" then
    cfg.root_dir = vim.fs.root(bufnr, cfg.root_markers or config.root_markers)
  end
  vim.api.nvim_create_autocmd("LspAttach", {
    buffer = bufnr,
    callback = function(args)
      local c = vim.lsp.get_client_by_id(args.data.client_id)
      if c and c.name == "dice" then
        vim.schedule(function()
          fn(c)
        end)
        return true -- once
      end
    end,
  })
  if not vim.lsp.start(cfg, { bufnr = bufnr }) then
    vim.notify("DICE: could not start dice-lsp", vim.log.levels.ERROR)
  end
end

local function exec(command, opts, handler)
  local bufnr = vim.api.nvim_get_current_buf()
  local position
  if opts.with_position then
    position = vim.api.nvim_win_get_cursor(0)
  end
  with_client(bufnr, opts.on_demand, function(client)
    local arguments = { vim.uri_from_bufnr(bufnr) }
    if position then
      local line = vim.api.nvim_buf_get_lines(bufnr, position[1] - 1, position[1], false)[1] or ""
      local ok, character = pcall(vim.str_utfindex, line, client.offset_encoding, position[2], false)
      arguments[2] = { line = position[1] - 1, character = ok and character or position[2] }
    end
    client:exec_cmd({ title = command, command = command, arguments = arguments }, { bufnr = bufnr }, handler)
  end)
end

function M.fill_all_masks(handler)
  exec("dice.fillAllMasks", {}, handler)
end

function M.fill_mask(handler)
  exec("dice.fillMask", { with_position = true }, handler)
end

function M.validate(handler)
  exec("dice.validateKernel", { on_demand = true }, handler)
end

function M.generate(handler)
  exec("dice.generateKernel", { on_demand = true }, handler)
end

--- Flips `automaticTrigger` and sends the settings to the running servers.
function M.toggle_automatic()
  config.settings.automaticTrigger = not automatic_enabled()
  for _, client in ipairs(vim.lsp.get_clients({ name = "dice" })) do
    client.settings = vim.tbl_deep_extend("force", client.settings or {}, { dice = config.settings })
    client:notify("workspace/didChangeConfiguration", { settings = { dice = config.settings } })
  end
  if not automatic_enabled() then
    M.dismiss()
  end
  vim.notify("DICE: automatic suggestions " .. (automatic_enabled() and "on" or "off"), vim.log.levels.INFO)
  return automatic_enabled()
end

-- ------------------------------------------------------------------ buffers

local function schedule_automatic(bufnr)
  if not automatic_enabled() then
    return
  end
  local timer = timers[bufnr]
  if not timer then
    timer = assert(vim.uv.new_timer())
    timers[bufnr] = timer
  end
  timer:stop()
  timer:start(
    config.debounce_ms,
    0,
    vim.schedule_wrap(function()
      if
        vim.api.nvim_buf_is_valid(bufnr)
        and vim.api.nvim_get_current_buf() == bufnr
        and insert_mode()
        and vim.fn.pumvisible() == 0
        and client_for(bufnr)
      then
        M.suggest({ automatic = true })
      end
    end)
  )
end

local function stop_timer(bufnr)
  if timers[bufnr] then
    timers[bufnr]:stop()
  end
end

local function forget_status(bufnr)
  if M.suggestion_status[bufnr] then
    M.suggestion_status[bufnr] = nil
    redraw_status()
  end
end

local function feed(lhs)
  vim.api.nvim_feedkeys(vim.keycode(lhs), "n", false)
end

local function set_keymaps(bufnr)
  if config.keymaps == false then
    return
  end
  local keys = vim.tbl_extend("force", default_keys, type(config.keymaps) == "table" and config.keymaps or {})
  local function map(modes, lhs, fn, desc)
    if lhs then
      vim.keymap.set(modes, lhs, fn, { buffer = bufnr, silent = true, desc = "DICE: " .. desc })
    end
  end
  map({ "n", "i" }, keys.accept, function()
    if not M.accept() then
      M.suggest()
    end
  end, "accept the suggestion (or ask for one)")
  map({ "n", "i" }, keys.next, M.next, "next suggestion")
  map({ "n", "i" }, keys.prev, M.prev, "previous suggestion")
  map("i", keys.dismiss, function()
    if not M.dismiss() then
      feed(keys.dismiss)
    end
  end, "dismiss the suggestion")
end

local attached = {} -- bufnr -> true once its autocmds and keymaps are set
local configured = false -- vim.lsp.config("dice") was set by an earlier setup()

local function on_attach(bufnr)
  if attached[bufnr] or not vim.tbl_contains(config.filetypes, vim.bo[bufnr].filetype) then
    return
  end
  attached[bufnr] = true
  local group = vim.api.nvim_create_augroup("dice.buffer." .. bufnr, { clear = true })
  local function on(events, callback)
    vim.api.nvim_create_autocmd(events, { group = group, buffer = bufnr, callback = callback })
  end
  on("TextChangedI", function()
    if shown and vim.b[bufnr].changedtick ~= shown.changedtick then
      clear()
    end
    if pending and pending.bufnr == bufnr then
      M.cancel("stale")
    end
    forget_status(bufnr)
    schedule_automatic(bufnr)
  end)
  on("CursorMovedI", function()
    local cursor = vim.api.nvim_win_get_cursor(0)
    local moved = function(at)
      return at and (at[1] ~= cursor[1] or at[2] ~= cursor[2])
    end
    if shown and moved(shown.cursor) then
      clear()
    end
    if pending and pending.bufnr == bufnr and moved(pending.cursor) then
      M.cancel("stale")
    end
    if not shown then
      schedule_automatic(bufnr)
    end
  end)
  on("TextChanged", function()
    if shown and vim.b[bufnr].changedtick ~= shown.changedtick then
      clear()
    end
    forget_status(bufnr)
  end)
  on("InsertLeave", function()
    stop_timer(bufnr)
    if pending and pending.bufnr == bufnr and pending.automatic then
      M.cancel()
    end
    if shown and shown.insert then
      clear()
    end
  end)
  on({ "BufLeave", "BufUnload" }, function()
    stop_timer(bufnr)
    if (shown and shown.bufnr == bufnr) or (pending and pending.bufnr == bufnr) then
      M.dismiss()
    end
  end)
  on("BufWipeout", function()
    attached[bufnr] = nil
    if timers[bufnr] then
      timers[bufnr]:close()
      timers[bufnr] = nil
    end
    M.suggestion_status[bufnr] = nil
    notified[bufnr] = nil
    pcall(vim.api.nvim_del_augroup_by_id, group)
  end)
  set_keymaps(bufnr)
end

--- setup{ cmd, settings, keymaps, filetypes, root_markers, debounce_ms, notify }; may be called again.
function M.setup(opts)
  opts = opts or {}
  config = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts)
  for _, key in ipairs({ "cmd", "filetypes", "root_markers" }) do
    if opts[key] ~= nil then
      config[key] = opts[key] -- a list replaces the default, it is not merged into it index by index
    end
  end
  vim.filetype.add({ extension = { cu = "cuda", cuh = "cuda" } })
  ghost.define_highlights()

  local settings = next(config.settings) and config.settings or vim.empty_dict()
  local lsp_config = {
    cmd = config.cmd,
    filetypes = config.filetypes,
    root_markers = config.root_markers,
    init_options = settings,
    settings = { dice = settings },
    handlers = {
      ["dice/status"] = on_status,
      ["dice/suggestionStatus"] = on_suggestion_status,
    },
    -- client-side: an inline item's command only carries its verdict label
    commands = { ["dice.suggestionAccepted"] = on_accepted },
  }
  if configured then
    vim.lsp.config.dice = lsp_config -- setup() again: replace (a merge would mix the old and new lists)
  else
    vim.lsp.config("dice", lsp_config) -- on top of what the user gave vim.lsp.config("dice", ...)
  end
  configured = true
  vim.lsp.enable("dice")

  local command = vim.api.nvim_create_user_command
  command("DiceSuggest", function()
    M.suggest()
  end, { desc = "DICE: suggest a fill at the cursor" })
  command("DiceNext", function()
    M.next()
  end, { desc = "DICE: next suggestion" })
  command("DicePrev", function()
    M.prev()
  end, { desc = "DICE: previous suggestion" })
  command("DiceAccept", function()
    M.accept()
  end, { desc = "DICE: insert the suggestion" })
  command("DiceDismiss", function()
    M.dismiss()
  end, { desc = "DICE: dismiss the suggestion" })
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
  command("DiceToggleAutomatic", function()
    M.toggle_automatic()
  end, { desc = "DICE: toggle automatic suggestions" })

  local group = vim.api.nvim_create_augroup("dice", { clear = true })
  vim.api.nvim_create_autocmd("LspAttach", {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == "dice" then
        on_attach(args.buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd("LspDetach", {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == "dice" and shown and shown.bufnr == args.buf then
        M.dismiss()
      end
    end,
  })
  vim.api.nvim_create_autocmd("ColorScheme", { group = group, callback = ghost.define_highlights })
  -- buffers the client attached to before a second setup() keep working
  for _, client in ipairs(vim.lsp.get_clients({ name = "dice" })) do
    for bufnr in pairs(client.attached_buffers) do
      attached[bufnr] = nil
      on_attach(bufnr)
    end
  end
end

return M
