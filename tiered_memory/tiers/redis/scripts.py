"""The Lua scripts of the hot tier on Redis (`hot.py` runs them): each read-modify-write of a
session's keys done atomically in Redis, so replicas writing at once never interleave inside one.

Each script's comment says what it guarantees; the two largest take their arguments by name
(`argv.py`).
"""

# Whether the cached summary `cur` is one of ours (the fields codec.decode_summary needs) newer
# than `version`. One that is not ours (damaged, or written by another release) is never newer:
# every read fails on it and goes to SQL, so the SQL answer must replace it, not bow to it.
NEWER_LUA = """
local function newer(cur, version)
  if not cur then return false end
  local ok, doc = pcall(cjson.decode, cur)
  if not ok or type(doc) ~= 'table' then return false end
  if type(doc['text']) ~= 'string' or type(doc['covered']) ~= 'number' or type(doc['updated_at']) ~= 'number'
     or type(doc['version']) ~= 'number' or (doc['source'] ~= 'llm' and doc['source'] ~= 'deterministic') then
    return false
  end
  for _, name in ipairs({'created_at', 'compressions'}) do
    if doc[name] ~= nil and type(doc[name]) ~= 'number' then return false end
  end
  for _, name in ipairs({'topics', 'structured'}) do
    if doc[name] ~= nil and doc[name] ~= cjson.null and type(doc[name]) ~= 'table' then return false end
  end
  return doc['version'] > tonumber(version)
end
"""

# Writes a summary only when no newer version is cached: a backfill from SQL racing a fresh
# summarization must not put the older text back. One key, so it is cluster-safe.
PUT_SUMMARY_LUA = (
    NEWER_LUA
    + """
if newer(redis.call('GET', KEYS[1]), ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""
)

# The characters of content in a recent-list entry (a JSON message): UTF-8 bytes less
# continuation bytes, as Python counts them. The list's total is kept in the state hash as
# `rchars`, valid while `rseq` and `rlen` are the message count and list length it was made at.
CHARS_LUA = """
local function chars_of(entry)
  local ok, doc = pcall(cjson.decode, entry)
  if not ok or type(doc) ~= 'table' or type(doc['content']) ~= 'string' then return 0 end
  -- What Message.size counts: the content and a call's tool_calls.
  local text = doc['content'] .. (type(doc['tc']) == 'string' and doc['tc'] or '')
  local _, continuation = string.gsub(text, '[\\128-\\191]', '')
  return #text - continuation
end
"""

# Refills a session from SQL. The summary is version-guarded like above, and so is the gateway's
# state (against the cached one and the state floor, PUT_STATE_LUA); the counters, the owner and
# the recent list are replaced only if no append newer than the caller's SQL read (a larger
# message count) has reached Redis meanwhile. Keys: summary, recent, state, state floor (one hash
# slot). ARGV: summary, version, summary TTL, msgs, turns, last, history TTL, replace list?, chars,
# tenant, user id ('' for none), the characters of the recent messages, the state's version (-1:
# none given) and JSON, then the messages (trimmed to the list's bound by the caller).
BACKFILL_LUA = (
    NEWER_LUA
    + """
if ARGV[1] ~= '' and not newer(redis.call('GET', KEYS[1]), ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
end
local gv = tonumber(ARGV[13])
if gv >= 0 then
  local cur = tonumber(redis.call('HGET', KEYS[3], 'gv') or '-1')
  if gv >= cur and gv >= tonumber(redis.call('GET', KEYS[4]) or '-1') then
    redis.call('HSET', KEYS[3], 'gv', ARGV[13], 'gs', ARGV[14])
  end
end
local have = tonumber(redis.call('HGET', KEYS[3], 'msgs') or '-1')
if have > tonumber(ARGV[4]) then return 0 end
if ARGV[8] == '1' then
  redis.call('DEL', KEYS[2])
  for i = 15, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
  if #ARGV >= 15 then redis.call('EXPIRE', KEYS[2], ARGV[7]) end
  redis.call('HSET', KEYS[3], 'rchars', ARGV[12], 'rseq', ARGV[4], 'rlen', #ARGV - 14)
end
redis.call('HSET', KEYS[3], 'turns', ARGV[5], 'msgs', ARGV[4], 'last', ARGV[6], 'chars', ARGV[9],
  'tenant', ARGV[10], 'uid', ARGV[11])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return 1
"""
)

# Appends one committed message, in order or not at all. Keys: recent, state, summary, state
# floor. A write that arrives late (it timed out here but Redis got it after newer ones) finds a
# count at or past its seq and changes nothing; a write that finds a gap (earlier appends never
# reached Redis) drops the session's hot entry, so the next read rebuilds it from SQL instead of
# trusting a stale window.
# ARGV[10] = '1' drops the entry first: this process failed a write of the session before. A
# session's first message drops any summary under its key: none can precede it, so one there is a
# stranger's (cached under a tenant session's bare id before schema version 6 moved it).
# The list keeps at most ARGV[7] messages, and past ARGV[14] only as many as hold ARGV[15]
# characters (0: ARGV[7] messages); ARGV[13] is the characters of this message. The running total
# is recounted from the list unless it was made at the previous count and length (a list refilled
# by a daemon that keeps none, or one that expired before the counters).
APPEND_LUA = (
    CHARS_LUA
    + """
if ARGV[10] == '1' then redis.call('DEL', KEYS[1], KEYS[2]) end
local seq = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[2], 'msgs', 'rchars', 'rseq', 'rlen')
local have = state[1]
if have then
  have = tonumber(have)
  if have >= seq then return 0 end
  if have < seq - 1 then
    redis.call('DEL', KEYS[1], KEYS[2])
    return -1
  end
end
if seq == 1 then redis.call('DEL', KEYS[3]) end
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
local most, least, bound = tonumber(ARGV[7]), tonumber(ARGV[14]), tonumber(ARGV[15])
if bound == 0 then
  redis.call('LTRIM', KEYS[1], -most, -1)
else
  local total
  if n > 1 and state[2] and state[3] and state[4] and have and tonumber(state[3]) == have
      and tonumber(state[4]) == n - 1 then
    total = tonumber(state[2]) + tonumber(ARGV[13])
  else
    total = 0
    for _, entry in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do total = total + chars_of(entry) end
  end
  while n > least do
    local first = chars_of(redis.call('LINDEX', KEYS[1], 0))
    if n <= most and total - first < bound then break end
    redis.call('LPOP', KEYS[1])
    total = total - first
    n = n - 1
  end
  redis.call('HSET', KEYS[2], 'rchars', total, 'rseq', seq, 'rlen', n)
end
redis.call('EXPIRE', KEYS[1], ARGV[8])
redis.call('HSET', KEYS[2], 'turns', ARGV[3], 'msgs', ARGV[4], 'last', ARGV[5], 'chars', ARGV[6],
  'tenant', ARGV[11], 'uid', ARGV[12])
-- A new session has no gateway state yet (PUT …/state needs the session): known, so not read;
-- unless a PUT reached Redis before this write did (its floor is there): then unknown, so read.
if seq == 1 then
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HDEL', KEYS[2], 'gv', 'gs')
  else
    redis.call('HSET', KEYS[2], 'gv', 0, 'gs', '')
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[9])
return 1
"""
)

# Caches the gateway's state of a session in its state hash (fields gv, gs) unless a newer
# version is there; only beside counters (the ones a read needs come with backfill). A PUT's write
# also raises the session's state floor, a key of its own that lives as long as counters would
# and that only the session's delete removes (not a hot loss of the hash: a changed message, a
# gap, a process's failed write): a read that took an older state from SQL before this write's
# SQL commit, and refills the session after it, must not cache that older state (BACKFILL_LUA).
# A copy a read took from SQL (ARGV[4] = '0') is cached the same way but raises no floor.
# Keys: state, state floor. ARGV: version, the state's JSON ('' for none), the counters' TTL,
# written ('1': a PUT's).
PUT_STATE_LUA = """
local v = tonumber(ARGV[1])
if v < tonumber(redis.call('GET', KEYS[2]) or '-1') then return 0 end
if ARGV[4] == '1' then redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3]) end
local cur = redis.call('HMGET', KEYS[1], 'msgs', 'gv')
if not cur[1] or tonumber(cur[2] or '-1') > v then return 0 end
redis.call('HSET', KEYS[1], 'gv', ARGV[1], 'gs', ARGV[2])
return 1
"""

# Extends the lock only if our token still holds it.
EXTEND_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Deletes the lock only if our token still holds it (the classic safe release).
UNLOCK_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
