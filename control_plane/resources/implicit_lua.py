"""The session key of a request without a session header, made inside Envoy by a Lua filter
(LuaJIT): the first configured body field `json_to_metadata` found, else the implicit
conversation key over the body. It goes on as request header `x-kvgate-session-key`
(kvgate.session.SESSION_KEY_HEADER, removed from what clients send), percent-encoded
(kvgate.session.carry_key: every byte outside printable ASCII, `%`, and a space at either end),
so an id with any bytes (LF, CR, NUL, DEL, non-UTF-8) is a valid header and gRPC metadata value.
A field `json_to_metadata` did not deliver though the body has it (JSON that is not UTF-8, a
lone surrogate escape, a value over its 8 KiB) is read by the script itself. An id that cannot
be carried — longer than MAX_CARRIED_KEY once encoded — is sent as UNCARRIED_KEY: ext_proc
counts it (`kvgate_ext_proc_session_sources_total{source="uncarried"}`) and routes the request
without a session.
Three readers use that one header: ext_proc (which decodes it), the ext_proc cluster's affinity
ring and, while ext_proc does not answer, the route's ring_hash fallback, which thus hashes the
same bytes ext_proc's first placement hashes (kvgate.placement.ring).

The implicit key, for a request that carries no session id, is an excerpt of the prompt's
leading content, which stays the same across one conversation's turns (clients resend the
whole conversation):
- chat (`messages`, or the Responses API's `input` list): the messages from the first one up to
  and including the first user message; sent as its length, its first 256 bytes (the system
  prompt's start) and the first and last 384 bytes of that user message. Conversations sharing
  a system prompt differ in their first user message; the turns of one conversation do not.
- completions (`prompt`, or a string `input`): the prompt's first 8 KiB (raw JSON).
It is prefixed with kvgate.session.IMPLICIT_PREFIX (an id hashed in its own space). An ASCII
one is also written to metadata `kvgate.session` as before, which ext_proc replicas of earlier
versions read (cut at a byte count, other text may end inside a UTF-8 character: forwarded as
metadata, such a string failed the whole ext_proc message, so the request went unplaced).
No hash library exists in Envoy's Lua; ext_proc's SHA-1 of the excerpt costs ~1 µs.

The script walks the JSON with `string.find` jumps (C speed), never character by character,
and gives up (no key: the request is sessionless) on anything it does not understand.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.session import (
    BODY_METADATA_NAMESPACE,
    IMPLICIT_KEY,
    IMPLICIT_PREFIX,
    MAX_CARRIED_KEY,
    SESSION_KEY_HEADER,
    UNCARRIED_KEY,
)

HEAD_BYTES = 256  # of the messages list: the system prompt's start
PART_BYTES = 384  # of the first user message: its start and its end
PROMPT_BYTES = 8192  # of a completions prompt

# Placeholders (@NAME@) rather than %-formatting: the script's Lua patterns are full of `%`.
_SCRIPT = r"""
local NS, KEY, HEADER = "@NS@", "@KEY@", "@HEADER@"
local FIELDS, PATHS, IMPLICIT, PREFIX = {@FIELDS@}, {@PATHS@}, @IMPLICIT@, "@PREFIX@"
local MAX_CARRIED, UNCARRIED = @MAX_CARRIED@, "@UNCARRIED@"
local HEAD, PART, PROMPT = @HEAD@, @PART@, @PROMPT@
local find, byte, sub, gsub, format = string.find, string.byte, string.sub, string.gsub,
  string.format

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
    if (q - b) % 2 == 1 then return q end
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
  local q = find(s, "[,}%]]", p)
  return q and q - 1
end

-- Inside an object or a list, from just after its opening bracket or after an item: where the
-- next item starts and its first byte (nil at the end or on anything unexpected; the caller
-- checks the byte).
local function next_item(s, p)
  p = ws(s, p)
  if p ~= nil and byte(s, p) == 44 then p = ws(s, p + 1) end
  if p == nil then return nil end
  return p, byte(s, p)
end

-- The first member named in `wanted` of the object at s[start] (or after whitespace there):
-- its name and where its value starts.
local function member(s, wanted, start)
  local p = ws(s, start)
  if p == nil or byte(s, p) ~= 123 then return nil end
  p = p + 1
  while true do
    local c
    p, c = next_item(s, p)
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
  local r = find(s, '"role"%s*:%s*"user"', a)
  if r == nil then return nil end
  local p = a + 1
  while true do
    local c
    p, c = next_item(s, p)
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

-- The implicit key of the body `s` (nil: none).
local function implicit_key(s)
  local name, a = member(s, WANTED, 1)
  if name == nil then return nil end
  if byte(s, a) == 91 and name ~= "prompt" then return chat_key(s, a) end
  if name == "messages" then return nil end
  local e = any_end(s, a)
  if e ~= nil then return "prompt:" .. sub(s, a, math.min(e, a + PROMPT - 1)) end
  return nil
end

-- kvgate.session.carry_key: printable ASCII but `%` kept, all else %XX; a space only inside.
local function hex(c) return format("%%%02X", byte(c)) end
local function carried(v)
  local e = gsub(v, "[^ !-$&-~]", hex)
  if byte(e, 1) == 32 then e = "%20" .. sub(e, 2) end
  if byte(e, -1) == 32 then e = sub(e, 1, -2) .. "%20" end
  return e
end

-- The first configured body field json_to_metadata found with something besides whitespace.
local function body_field(found)
  if found == nil then return nil end
  for _, field in ipairs(FIELDS) do
    local v = found[field]
    if type(v) == "string" and find(v, "[^ \t\n\r\v\f]") then return v end
  end
  return nil
end

-- JSON string escapes, for the rare body json_to_metadata refused.
local ESCAPED = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
                 r = "\r", t = "\t"}
local function utf8(c)
  local char, floor = string.char, math.floor
  if c < 0x80 then return char(c) end
  if c < 0x800 then return char(0xC0 + floor(c / 64), 0x80 + c % 64) end
  if c < 0x10000 then
    return char(0xE0 + floor(c / 4096), 0x80 + floor(c / 64) % 64, 0x80 + c % 64)
  end
  return char(0xF0 + floor(c / 262144), 0x80 + floor(c / 4096) % 64,
              0x80 + floor(c / 64) % 64, 0x80 + c % 64)
end

-- The text of the JSON string s[p..e] (quotes at p and e), its bytes as they are, escapes
-- decoded (a lone surrogate as its 3 bytes); nil if an escape is not JSON.
local function json_text(s, p, e)
  local out, i = {}, p + 1
  while true do
    local b = find(s, "\\", i, true)
    if b == nil or b >= e then
      out[#out + 1] = sub(s, i, e - 1)
      return table.concat(out)
    end
    out[#out + 1] = sub(s, i, b - 1)
    local c = sub(s, b + 1, b + 1)
    if c == "u" then
      local cp = tonumber(sub(s, b + 2, b + 5), 16)
      if cp == nil then return nil end
      i = b + 6
      local lo = sub(s, i, i + 1) == "\\u" and tonumber(sub(s, i + 2, i + 5), 16)
      if cp >= 0xD800 and cp < 0xDC00 and lo and lo >= 0xDC00 and lo < 0xE000 then
        cp, i = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00), i + 6
      end
      out[#out + 1] = utf8(cp)
    else
      if ESCAPED[c] == nil then return nil end
      out[#out + 1], i = ESCAPED[c], b + 2
    end
  end
end

-- The first configured field the body has (a string, or a number's text) that json_to_metadata
-- did not deliver: JSON it refuses (bytes not UTF-8, a lone surrogate) or a value over its
-- 8 KiB. A plain find of the field's last name first: most bodies do not hold it at all.
local function unread_field(s, found)
  for i, path in ipairs(PATHS) do
    if (found == nil or found[FIELDS[i]] == nil) and find(s, path[#path], 1, true) then
      local p = 1
      for _, name in ipairs(path) do
        if p ~= nil then p = select(2, member(s, {[name] = true}, p)) end
      end
      local c, v = p and byte(s, p), nil
      if c == 34 then
        local e = string_end(s, p)
        v = e and json_text(s, p, e)
      elseif c == 45 or (c and c >= 48 and c <= 57) then
        v = sub(s, p, any_end(s, p))
      end
      if v and find(v, "[^ \t\n\r\v\f]") then return v end
    end
  end
  return nil
end

function envoy_on_request(handle)
  local found = handle:streamInfo():dynamicMetadata():get(NS)
  local key = body_field(found)
  if key == nil then
    local body = handle:body()  -- waits for the whole body
    if body == nil or body:length() == 0 then return end
    local s = body:getBytes(0, body:length())
    key = unread_field(s, found)
    if key == nil and IMPLICIT then
      local implicit = implicit_key(s)
      if implicit == nil then return end
      -- For ext_proc replicas of earlier versions, which read it there; only if ASCII: cut at a
      -- byte count it may end inside a UTF-8 character, and a metadata string that is not
      -- UTF-8 fails the whole ext_proc message. (Envoy objects do not survive the wait for the
      -- body: ask for them again after it.)
      if not find(implicit, "[\128-\255]") then
        handle:streamInfo():dynamicMetadata():set(NS, KEY, implicit)
      end
      key = PREFIX .. implicit
    end
    if key == nil then return end
  end
  -- An id too long to carry is said so: ext_proc counts it and routes without a session.
  local value = carried(key)
  if #value > MAX_CARRIED then value = UNCARRIED end
  handle:headers():replace(HEADER, value)
end
"""


def _lua_string(text: str) -> str:
    """`text` as the inside of a Lua double-quoted string (decimal escapes: any byte)."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_.:@ " else
                   "".join(f"\\{b:03d}" for b in c.encode()) for c in text)


def session_key_script(
    fields: Sequence[str], implicit: bool, *,
    head: int = HEAD_BYTES, part: int = PART_BYTES, prompt: int = PROMPT_BYTES,
) -> str:
    """The Lua source of the filter: `fields` in their configured order, the implicit key if
    `implicit` (the excerpt sizes are parameters for tests)."""
    values = {
        "NS": _lua_string(BODY_METADATA_NAMESPACE), "KEY": _lua_string(IMPLICIT_KEY),
        "HEADER": _lua_string(SESSION_KEY_HEADER),
        "FIELDS": ", ".join(f'"{_lua_string(field)}"' for field in fields),
        "PATHS": ", ".join("{" + ", ".join(f'"{_lua_string(name)}"' for name in field.split("."))
                           + "}" for field in fields),
        "IMPLICIT": "true" if implicit else "false",
        "PREFIX": _lua_string(IMPLICIT_PREFIX.decode("latin-1")),
        "MAX_CARRIED": str(MAX_CARRIED_KEY), "UNCARRIED": _lua_string(UNCARRIED_KEY),
        "HEAD": str(head), "PART": str(part), "PROMPT": str(prompt),
    }
    script = _SCRIPT
    for name, value in values.items():
        script = script.replace(f"@{name}@", value)
    return script
