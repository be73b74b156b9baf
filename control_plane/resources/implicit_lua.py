"""The implicit conversation key, computed inside Envoy by a Lua filter (LuaJIT) over the body.

For a request that carries no session id, the key is an excerpt of the prompt's leading content,
which stays the same across one conversation's turns (clients resend the whole conversation):
- chat (`messages`, or the Responses API's `input` list): the messages from the first one up to
  and including the first user message; sent as its length, its first 256 bytes (the system
  prompt's start) and the first and last 384 bytes of that user message. Conversations sharing
  a system prompt differ in their first user message; the turns of one conversation do not.
- completions (`prompt`, or a string `input`): the prompt's first 8 KiB (raw JSON).
The excerpt (at most ~8 KiB, usually ~1 KiB) goes to ext_proc as dynamic metadata, which hashes
it like any other id; no hash library exists in Envoy's Lua, and ext_proc's SHA-1 costs ~1 µs.

The script walks the JSON with `string.find` jumps (C speed), never character by character,
and gives up (no key: the request is sessionless) on anything it does not understand.
"""

from __future__ import annotations

from kvgate.session import BODY_METADATA_NAMESPACE, IMPLICIT_KEY

HEAD_BYTES = 256  # of the messages list: the system prompt's start
PART_BYTES = 384  # of the first user message: its start and its end
PROMPT_BYTES = 8192  # of a completions prompt

_SCRIPT = r"""
local NS, KEY = "%(namespace)s", "%(key)s"
local HEAD, PART, PROMPT = %(head)d, %(part)d, %(prompt)d
local find, byte, sub = string.find, string.byte, string.sub

local function ws(s, p) return find(s, "[^ \t\r\n]", p) end

-- s[i] is an opening quote: the index of its closing quote. Jumps from quote to quote (a plain
-- find), so escapes cost nothing; a quote after an odd run of backslashes is escaped.
local function string_end(s, i)
  local p = i + 1
  while true do
    local q = find(s, '"', p, true)
    if q == nil then return nil end
    local b = q - 1
    while byte(s, b) == 92 do b = b - 1 end
    if (q - b) %% 2 == 1 then return q end
    p = q + 1
  end
end

-- s[i] is '{' or '[': the index of the bracket closing it.
local function value_end(s, i)
  local depth, p = 0, i
  while true do
    local q = find(s, '[][{}"]', p)
    if q == nil then return nil end
    local c = byte(s, q)
    if c == 34 then
      q = string_end(s, q)
      if q == nil then return nil end
    elseif c == 123 or c == 91 then
      depth = depth + 1
    else
      depth = depth - 1
      if depth == 0 then return q end
    end
    p = q + 1
  end
end

-- Any JSON value starting at s[p]: the index of its last character.
local function any_end(s, p)
  local c = byte(s, p)
  if c == 34 then return string_end(s, p) end
  if c == 123 or c == 91 then return value_end(s, p) end
  local q = find(s, "[,}%%]]", p)
  return q and q - 1
end

-- The first top-level member named in `wanted`: its name and where its value starts.
local function member(s, wanted)
  local p = ws(s, 1)
  if p == nil or byte(s, p) ~= 123 then return nil end
  p = p + 1
  while true do
    p = ws(s, p)
    if p == nil then return nil end
    local c = byte(s, p)
    if c == 44 then
      p = ws(s, p + 1)
      if p == nil then return nil end
      c = byte(s, p)
    end
    if c ~= 34 then return nil end
    local e = string_end(s, p)
    if e == nil then return nil end
    local name = sub(s, p + 1, e - 1)
    p = find(s, ":", e + 1, true)
    if p == nil then return nil end
    p = ws(s, p + 1)
    if p == nil then return nil end
    if wanted[name] then return name, p end
    e = any_end(s, p)
    if e == nil then return nil end
    p = e + 1
  end
end

-- A list of messages starting at s[a] ('['): the excerpt up to the first user message.
local function chat_key(s, a)
  -- Outside strings only: inside one, every quote is escaped, so this cannot match there.
  local r = find(s, '"role"%%s*:%%s*"user"', a)
  if r == nil then return nil end
  local p = a + 1
  while true do
    p = ws(s, p)
    if p == nil then return nil end
    local c = byte(s, p)
    if c == 44 then
      p = ws(s, p + 1)
      if p == nil then return nil end
      c = byte(s, p)
    end
    if c ~= 123 then return nil end
    local e = value_end(s, p)
    if e == nil then return nil end
    if r < e then
      local user
      if e - p + 1 <= 2 * PART then
        user = sub(s, p, e)
      else
        user = sub(s, p, p + PART - 1) .. "|" .. sub(s, e - PART + 1, e)
      end
      return "chat:" .. (e - a) .. ":" .. sub(s, a, math.min(a + HEAD - 1, p - 1)) .. "|" .. user
    end
    p = e + 1
  end
end

local WANTED = {messages = true, input = true, prompt = true}

function envoy_on_request(handle)
  -- A body field carries the session. (Envoy objects do not survive the wait for the body:
  -- ask for them again after it.)
  if handle:streamInfo():dynamicMetadata():get(NS) ~= nil then return end
  local body = handle:body()
  if body == nil then return end
  local length = body:length()
  if length == 0 then return end
  local s = body:getBytes(0, length)
  local name, a = member(s, WANTED)
  if name == nil then return end
  local key
  if byte(s, a) == 91 and name ~= "prompt" then
    key = chat_key(s, a)
  elseif name ~= "messages" then
    local e = any_end(s, a)
    if e ~= nil then key = "prompt:" .. sub(s, a, math.min(e, a + PROMPT - 1)) end
  end
  if key ~= nil then handle:streamInfo():dynamicMetadata():set(NS, KEY, key) end
end
"""


def implicit_session_script(
    head: int = HEAD_BYTES, part: int = PART_BYTES, prompt: int = PROMPT_BYTES
) -> str:
    """The Lua source of the filter (the excerpt sizes are parameters for tests)."""
    return _SCRIPT % {
        "namespace": BODY_METADATA_NAMESPACE, "key": IMPLICIT_KEY,
        "head": head, "part": part, "prompt": prompt,
    }
