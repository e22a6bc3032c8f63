"""The Redis scripts of :class:`~ldpstream.agents.store.count_store.CountStore`: each one's keys, arguments
and answer (docs/pipeline.md "Exactly once"). Every script checks all it reads before
its first write, so an error leaves nothing half-written (Redis does not roll a script back)."""
from __future__ import annotations

__all__ = ["APPLY_LUA", "REBASE_LUA", "NOTE_START_LUA", "RESET_SHARD_LUA", "RESET_HOLD_S",
           "ROWS_LUA", "FIELDS_LUA", "SIZING_LUA", "PACKED_ADD_LUA", "PACKED_BLOCK_CELLS", "PACKED_MAX_BYTES"]

#: cells a packed delta's block unpacks at once (2 Lua values each; Lua's C stack holds 8,000)
PACKED_BLOCK_CELLS = 256
#: the longest a packed delta may reach into its chunk string, in bytes (Redis' 512 MB string cap)
PACKED_MAX_BYTES = 512 * 1024 * 1024

# A packed (dense) chunk delta "*<u32 first cell, little-endian><int64 big-endian deltas>" added
# to cells first.. of a count string (agents/store/packed_delta.py): the cells read once
# (GETRANGE), added, written back once (SETRANGE), instead of one BITFIELD INCRBY each. Lua 5.1
# numbers are doubles, exact only to 2^53: a block of cells whose counts and deltas are all
# below 2^52 in magnitude (every real count) is added as int64 words; any other block as two
# 32-bit halves each (high signed, low unsigned) with the carry, wrapping at 2^63 as BITFIELD's
# default OVERFLOW WRAP does. Either way the string is the same, byte for byte, as the BITFIELD
# increments of the nonzero cells would leave it. packed_ok(blob): its shape, checked before the
# apply's first write.
PACKED_ADD_LUA = """
local PACK_FMT = {}
local function pack_fmt(word, m)
  local f = PACK_FMT[word .. m]
  if not f then f = '>' .. string.rep(word, m); PACK_FMT[word .. m] = f end
  return f
end
local function packed_ok(blob)
  if #blob < 13 or (#blob - 5) % 8 ~= 0 then return false end
  return 8 * struct.unpack('<I4', blob, 2) + #blob - 5 <= @MAX_BYTES@
end
local function small(t, m)  -- every value of t[1..m] within +-2^52
  return math.max(unpack(t, 1, m)) < 4503599627370496
    and math.min(unpack(t, 1, m)) > -4503599627370496
end
local function packed_add(key, blob)
  local from = 8 * struct.unpack('<I4', blob, 2)
  local n = (#blob - 5) / 8
  local cur = redis.call('GETRANGE', key, from, from + 8 * n - 1)
  if #cur < 8 * n then cur = cur .. string.rep('\\0', 8 * n - #cur) end
  local out = {}
  local i = 0
  while i < n do
    local m = math.min(@BLOCK@, n - i)
    local f = pack_fmt('i8', m)
    local c = {struct.unpack(f, cur, 1 + 8 * i)}
    local d = {struct.unpack(f, blob, 6 + 8 * i)}
    local words = m
    if small(c, m) and small(d, m) then
      for j = 1, m do c[j] = c[j] + d[j] end
    else
      f = pack_fmt('i4I4', m)
      c = {struct.unpack(f, cur, 1 + 8 * i)}
      d = {struct.unpack(f, blob, 6 + 8 * i)}
      for j = 1, 2 * m, 2 do
        local lo = c[j + 1] + d[j + 1]
        local hi = c[j] + d[j]
        if lo >= 4294967296 then lo = lo - 4294967296; hi = hi + 1 end
        if hi >= 2147483648 then hi = hi - 4294967296 elseif hi < -2147483648 then hi = hi + 4294967296 end
        c[j] = hi; c[j + 1] = lo
      end
      words = 2 * m
    end
    out[#out + 1] = struct.pack(f, unpack(c, 1, words))
    i = i + m
  end
  redis.call('SETRANGE', key, from, table.concat(out))
end
""".replace("@MAX_BYTES@", str(PACKED_MAX_BYTES)).replace("@BLOCK@", str(PACKED_BLOCK_CELLS))

# KEYS: offsets hash, sent_at_max, then the chunk keys, then the side-counter keys.
# ARGV: ops per BITFIELD call, expected ('' = unchecked: apply when offset > stored), offset,
#       n_reports, sent_at ('' = none), number of chunk keys C, number of side keys S; then for each
#       chunk key: PEXPIREAT ms ('' = none) and a text blob "#<cell> <delta> #<cell> <delta> ..."
#       (one blob per key keeps redis-py's argument packing off the hot path, and string.gmatch
#       hands the script ready-made arguments); then for each side key: PEXPIREAT ms ('' = none)
#       and "<field> <increment> ..." (HINCRBY) or "=<field> <value> ..." (HSET: fields and values
#       of digits, ':' and '-') or "+<bytes>" (APPEND to a string: int64 words) or "!<bytes>" (SET;
#       "!" alone: DEL) or "~<patch>" (a device state segment, agents/store/memo_log.py
#       patch_blob: u32 appended length A, u32 row length L, A bytes appended, then N u32 byte
#       offsets and N rows of L bytes each rewritten there with SETRANGE, within the string;
#       "^<patch>" the same, then the string copied to drop the spare room APPEND left) or
#       "<" (a staging string written before the call, consumed by the next side key) and ">"
#       (RENAME the previous side key, a "<", to this one: big new bytes never pass through Lua,
#       which copies its arguments at ~5 ns a byte) or "?<B>" (the meta hash of the bucketed side
#       hashes before it, agents/store/side_buckets.py: field b set to B if absent, the delta
#       refused as a conflict if it holds another B; field n grows by the fields those hashes
#       gained). A refused delta deletes its staging keys.
# A chunk key's blob may instead be a packed delta "*..." (PACKED_ADD_LUA).
# Returns {status (1 applied, 0 replayed, -1 conflict), stored offset after (-1: none)}.
APPLY_LUA = PACKED_ADD_LUA + """
local maxargs = 4 * tonumber(ARGV[1])
local offset = tonumber(ARGV[3])
local nchunks = tonumber(ARGV[6])
local nside = tonumber(ARGV[7])
local raw = redis.call('HGET', KEYS[1], 'offset')
local stored = -1
if raw then stored = tonumber(raw) end
local hold = redis.call('HGET', KEYS[1], 'reset_until')
if hold then  -- a reset of the shard is under way (CountStore.reset): refused like a conflict
  local t = redis.call('TIME')
  if tonumber(hold) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return {-1, stored}
  end
end
local status
if ARGV[2] == '' then
  if stored < offset then status = 1 else status = 0 end
elseif stored == tonumber(ARGV[2]) then status = 1
elseif stored >= offset then status = 0
else status = -1 end
local function refuse(st)
  for j = nchunks + 1, nchunks + nside do
    if ARGV[7 + 2 * j] == '<' then redis.call('DEL', KEYS[2 + j]) end
  end
  return {st, stored}
end
if status ~= 1 then return refuse(status) end
-- every check before the first write: Redis does not roll a script back (agents/store/apply_guard.py)
if #ARGV ~= 7 + 2 * (nchunks + nside) or not string.match(ARGV[3], '^%d+$')
    or not string.match(ARGV[4], '^%d+$') or (ARGV[5] ~= '' and not tonumber(ARGV[5])) then
  return redis.error_reply('ldp-apply: malformed arguments')
end
local function is_int(v) return (not v) or string.match(v, '^%-?%d+$') ~= nil end
local function typed(key, want)
  local t = redis.call('TYPE', key)['ok']
  return t == 'none' or t == want
end
if not typed(KEYS[2], 'string') or not is_int(redis.call('HGET', KEYS[1], 'n')) then
  return redis.error_reply('ldp-apply: corrupt sent_at or n of ' .. KEYS[1])
end
local function is_log(j)
  local c = string.sub(ARGV[7 + 2 * j], 1, 1)
  return j > nchunks and (c == '+' or c == '!' or c == '~' or c == '^' or c == '<' or c == '>')
end
for j = 1, nchunks + nside do
  if not typed(KEYS[2 + j], (j <= nchunks or is_log(j)) and 'string' or 'hash') then
    return redis.error_reply('ldp-apply: wrong type of ' .. KEYS[2 + j])
  end
end
for j = 1, nchunks + nside do
  local e = ARGV[6 + 2 * j]
  if e ~= '' and not (string.match(e, '^%d+$') and #e <= 15) then
    return redis.error_reply('ldp-apply: expiry out of range: ' .. e)
  end
  local blob = ARGV[7 + 2 * j]
  if j <= nchunks and string.sub(blob, 1, 1) == '*' then
    if not packed_ok(blob) then return redis.error_reply('ldp-apply: malformed packed delta') end
  elseif j <= nchunks then
    if string.find(blob, '[^#%d %-]') then
      return redis.error_reply('ldp-apply: malformed increments')
    end
  elseif is_log(j) and (blob == '<' or blob == '>') then
    if blob == '>' and (ARGV[5 + 2 * j] ~= '<' or redis.call('EXISTS', KEYS[1 + j]) == 0) then
      return redis.error_reply('ldp-apply: staged side string missing for ' .. KEYS[2 + j])
    end
  elseif is_log(j) and (string.sub(blob, 1, 1) == '~' or string.sub(blob, 1, 1) == '^') then
    if #blob < 9 then return redis.error_reply('ldp-apply: malformed side patch') end
    local alen, L = struct.unpack('<I4I4', blob, 2)
    local rest = #blob - 9 - alen
    if alen % 8 ~= 0 or rest < 0 or (rest > 0 and (L < 4 or L % 4 ~= 0 or rest % (4 + L) ~= 0)) then
      return redis.error_reply('ldp-apply: malformed side patch')
    end
    local len = redis.call('STRLEN', KEYS[2 + j])
    for i = 0, rest / (4 + L) - 1 do
      local off = struct.unpack('<I4', blob, 10 + alen + 4 * i)
      if off % 4 ~= 0 or off + L > len then
        return redis.error_reply('ldp-apply: side patch beyond ' .. KEYS[2 + j])
      end
    end
  elseif is_log(j) then  -- a log of int64 words (agents/store/device_memo.py)
    if (#blob - 1) % 8 ~= 0 then
      return redis.error_reply('ldp-apply: malformed side log')
    end
  elseif string.sub(blob, 1, 1) == '?' then  -- a bucketed window's meta: its B recorded or ours
    if not string.match(blob, '^%?%d+$') then
      return redis.error_reply('ldp-apply: malformed side buckets')
    end
    local b = redis.call('HGET', KEYS[2 + j], 'b')
    if b and b ~= string.sub(blob, 2) then return refuse(-1) end
  elseif string.sub(blob, 1, 1) == '=' then  -- values set: digits, ':' and '-' only, one scan
    if string.find(blob, '[^%d:%- ]', 2) then
      return redis.error_reply('ldp-apply: malformed side values')
    end
  else
    for f, v in string.gmatch(blob, '(%S+) (%S+)') do
      if #v > 18 or not string.match(v, '^%-?%d+$')
          or not is_int(redis.call('HGET', KEYS[2 + j], f)) then
        return redis.error_reply('ldp-apply: malformed side values')
      end
    end
  end
end
for j = 1, nchunks do
  local key = KEYS[2 + j]
  local args = {}
  local a = 0
  if string.sub(ARGV[7 + 2 * j], 1, 1) == '*' then
    packed_add(key, ARGV[7 + 2 * j])
  else
    for cell, delta in string.gmatch(ARGV[7 + 2 * j], '(%S+) (%S+)') do
      args[a + 1] = 'INCRBY'; args[a + 2] = 'i64'; args[a + 3] = cell; args[a + 4] = delta
      a = a + 4
      if a >= maxargs then
        redis.call('BITFIELD', key, unpack(args, 1, a))
        a = 0
      end
    end
    if a > 0 then redis.call('BITFIELD', key, unpack(args, 1, a)) end
  end
  if ARGV[6 + 2 * j] ~= '' then redis.call('PEXPIREAT', key, ARGV[6 + 2 * j]) end
end
local base = 7 + 2 * nchunks
local gained = 0  -- fields the side hashes since the last meta gained
for j = 1, nside do
  local key = KEYS[2 + nchunks + j]
  local blob = ARGV[base + 2 * j]
  local kind = string.sub(blob, 1, 1)
  if blob == '<' then  -- renamed by the next one
  elseif blob == '>' then
    redis.call('RENAME', KEYS[1 + nchunks + j], key)
  elseif kind == '+' then
    redis.call('APPEND', key, string.sub(blob, 2))
  elseif kind == '~' or kind == '^' then  -- rows rewritten, then appended (^: then trimmed)
    local alen, L = struct.unpack('<I4I4', blob, 2)
    local at = 10 + alen
    local n = (#blob - at + 1) / (4 + L)
    local base = at + 4 * n
    for i = 0, n - 1 do
      local off = struct.unpack('<I4', blob, at + 4 * i)
      redis.call('SETRANGE', key, off, string.sub(blob, base + L * i, base + L * (i + 1) - 1))
    end
    if alen > 0 then redis.call('APPEND', key, string.sub(blob, 10, 9 + alen)) end
    if kind == '^' and redis.call('EXISTS', key) == 1 then
      -- a finished segment: a copy holds its bytes without the room APPEND kept for growth
      local tmp = key .. ':trim'
      redis.call('DEL', tmp)
      redis.call('COPY', key, tmp)
      redis.call('RENAME', tmp, key)
    end
  elseif kind == '!' and #blob == 1 then
    redis.call('DEL', key)
  elseif kind == '!' then
    redis.call('SET', key, string.sub(blob, 2))
  elseif kind == '?' then
    redis.call('HSETNX', key, 'b', string.sub(blob, 2))
    if gained > 0 then redis.call('HINCRBY', key, 'n', gained) end
    gained = 0
  elseif kind == '=' then  -- one HSET per maxargs fields and values
    local args, a = {}, 0
    for f, v in string.gmatch(string.sub(blob, 2), '(%S+) (%S+)') do
      args[a + 1] = f; args[a + 2] = v
      a = a + 2
      if a >= maxargs then
        gained = gained + redis.call('HSET', key, unpack(args, 1, a))
        a = 0
      end
    end
    if a > 0 then gained = gained + redis.call('HSET', key, unpack(args, 1, a)) end
  else
    for f, delta in string.gmatch(blob, '(%S+) (%S+)') do
      if redis.call('HINCRBY', key, f, delta) == tonumber(delta) then gained = gained + 1 end
    end
  end
  if ARGV[base + 2 * j - 1] ~= '' then redis.call('PEXPIREAT', key, ARGV[base + 2 * j - 1]) end
end
redis.call('HSET', KEYS[1], 'offset', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'n', ARGV[4])
if ARGV[5] ~= '' then
  local cur = tonumber(redis.call('GET', KEYS[2]))
  if (not cur) or cur < tonumber(ARGV[5]) then redis.call('SET', KEYS[2], ARGV[5]) end
end
return {1, offset}
"""


# Re-base a partition's stored offset onto a new log (agents/ingest/log_identity.py): a compare-and-set
# on the stored offset. KEYS: offsets hash. ARGV: expected stored offset (-1: none), new offset
# (-1: none: count the new log from its start), the event (JSON).
# Returns {1 rebased | 0 the stored offset moved meanwhile, stored offset (-1: none)}.
REBASE_LUA = """
local raw = redis.call('HGET', KEYS[1], 'offset')
local stored = -1
if raw then stored = tonumber(raw) end
if stored ~= tonumber(ARGV[1]) then return {0, stored} end
if tonumber(ARGV[2]) < 0 then redis.call('HDEL', KEYS[1], 'offset')
else redis.call('HSET', KEYS[1], 'offset', ARGV[2]) end
redis.call('HDEL', KEYS[1], 'log')
redis.call('HINCRBY', KEYS[1], 'log_resets', 1)
redis.call('HSET', KEYS[1], 'log_reset', ARGV[3])
return {1, tonumber(ARGV[2])}
"""


# The poison-pill breaker (agents/ingest/breaker.py): KEYS: the shard's breaker hash. ARGV: the offset a
# worker starts the partition after (-1: none). Returns {1 if the previous owner died holding the
# partition (it never released it), the chunk it was processing carefully from this same offset
# ('' if none)}; the new owner holds it from now on.
NOTE_START_LUA = """
local live = redis.call('HGET', KEYS[1], 'live')
local chunk = redis.call('HGET', KEYS[1], 'chunk')
if redis.call('HGET', KEYS[1], 'at') ~= ARGV[1] then chunk = false end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'at', ARGV[1], 'live', 1)
local died = 0
if live == '1' then died = 1 end
return {died, chunk or ''}
"""


# Reset one shard at once, while its applies are held off (field reset_until of the offsets hash,
# set before its keys were listed: the apply script refuses a delta as a CONFLICT until then, so no
# key appears after the listing). KEYS: the offsets hash, then the shard's keys as listed. ARGV:
# '1' to keep the offsets hash (its n deleted). Lifts the hold; returns the keys deleted.
RESET_SHARD_LUA = """
local deleted = 0
for i = 2, #KEYS do
  if KEYS[i] == KEYS[1] and ARGV[1] == '1' then redis.call('HDEL', KEYS[1], 'n')
  else deleted = deleted + redis.call('DEL', KEYS[i]) end
end
redis.call('HDEL', KEYS[1], 'reset_until')
return deleted
"""

#: longest a shard's applies are held off by a reset (a reset that dies midway holds no longer)
RESET_HOLD_S = 60.0


# Rows of a device state segment read back by position (agents/store/memo_log.py): KEYS: the
# segment. ARGV: bytes a row L, u32 byte offsets (little-endian). Returns the rows concatenated
# (a row beyond the string's end padded with zero bytes). Read-only.
ROWS_LUA = """
local L = tonumber(ARGV[1])
local b = ARGV[2]
local out = {}
local zero = string.rep('\\0', L)
for i = 0, #b / 4 - 1 do
  local off = struct.unpack('<I4', b, 1 + 4 * i)
  local s = redis.call('GETRANGE', KEYS[1], off, off + L - 1)
  if #s < L then s = s .. string.sub(zero, 1, L - #s) end
  out[i + 1] = s
end
return table.concat(out)
"""


# Fields of side hashes of one shard read together with its stored offset, in one atomic step
# (agents/ingest/side_state.py: a poll reads its senders' dedupe and quota state, and learns from
# the offset which of its own unapplied deltas the values already hold). KEYS: the offsets hash,
# then the side hashes. ARGV: per side hash its fields, space-separated. Returns {stored offset
# (false: none), then per side hash the values of its fields in order (false: absent)}. Read-only.
FIELDS_LUA = """
local out = {redis.call('HGET', KEYS[1], 'offset')}
for i = 2, #KEYS do
  local vals, fields, n = {}, {}, 0
  for f in string.gmatch(ARGV[i - 1], '%S+') do
    n = n + 1
    fields[n] = f
    if n == 1000 then
      for _, v in ipairs(redis.call('HMGET', KEYS[i], unpack(fields, 1, n))) do vals[#vals + 1] = v end
      n = 0
    end
  end
  if n > 0 then
    for _, v in ipairs(redis.call('HMGET', KEYS[i], unpack(fields, 1, n))) do vals[#vals + 1] = v end
  end
  out[i] = vals
end
return out
"""


# What sizes the buckets of a window's per-device side hashes (agents/store/side_buckets.py).
# KEYS: the window's meta hash, the previous window's meta hash, the previous window's single
# hash of earlier versions. Returns {the window's recorded buckets (false: none), the fields of
# the previous window (its meta's n plus the single hash's)}. Read-only.
SIZING_LUA = """
local n = tonumber(redis.call('HGET', KEYS[2], 'n') or '0') + redis.call('HLEN', KEYS[3])
return {redis.call('HGET', KEYS[1], 'b'), n}
"""
