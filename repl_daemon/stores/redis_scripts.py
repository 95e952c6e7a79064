"""The Lua scripts of the Redis store: each operation on a session is one of them.

Every script touches only the keys of one session (``repl:{ID}:...``, one
hash slot, so a Redis Cluster runs it on the session's primary) and is one
atomic step: no read before it, no version, no retry. The rules they apply
are the core's (``session/``), restated here because Redis must apply them
itself; ``tests/stores/test_redis_differential.py`` runs the same random
operations through the core and through these scripts and requires the same
answers and the same final state. Every bound a script applies (cursors per
session, dedup keys) is passed in from ``session.rules``, never written
here.

The keys, in this order in every script's KEYS:

1. ``meta``     hash: ``limit``, ``head``, ``uses`` (the cursor-use clock), ``evals``
2. ``ring``     stream: the retained firings, entry id ``SEQ-0``; fields ``t`` (ts),
   ``h`` (handler), then ``r`` (result) or ``e`` (event)
3. ``cursors``  hash: name -> ``SEQ:LAST_USE``
4. ``keys``     hash: dedup key -> seq
5. ``keyorder`` list: the dedup keys, oldest first
6. ``wake``     the session's shard channel: every new firing publishes its
   seq there, a stop publishes ``stop`` (SPUBLISH, so the message stays on
   the session's own shard of a cluster)

A script answers ``{'ok', ...}`` or ``{'err', CODE, MESSAGE}`` with a wire
code of ``session.errors``; Lua numbers are doubles, so seqs are exact up to
2**53.
"""

from __future__ import annotations

# The shebang makes Redis treat each script as a function with flags: without
# ``allow-oom`` one that would write is refused before it starts when Redis is
# out of memory, rather than failing half way through.
_PRELUDE = """#!lua
local meta, ring, cursors = KEYS[1], KEYS[2], KEYS[3]
local keys, keyorder, wake = KEYS[4], KEYS[5], KEYS[6]
local function missing()
  return {'err', 'no_such_session', 'no session'}
end
local function cursor_seq(value)
  if not value then return 0 end
  return tonumber(string.match(value, '^(%d+)'))
end
-- a use of a cursor (SPEC rule 4): the clock ticks, a new cursor starts at 0
-- and evicts the least recently used one when the session has max_cursors
local function use(name, max_cursors)
  local uses = redis.call('HINCRBY', meta, 'uses', 1)
  local value = redis.call('HGET', cursors, name)
  if not value and redis.call('HLEN', cursors) >= max_cursors then
    local all = redis.call('HGETALL', cursors)
    local oldest, oldest_use = nil, nil
    for i = 1, #all, 2 do
      local last = tonumber(string.match(all[i + 1], ':(%d+)$'))
      if oldest_use == nil or last < oldest_use then
        oldest, oldest_use = all[i], last
      end
    end
    redis.call('HDEL', cursors, oldest)
  end
  return cursor_seq(value), uses
end
-- the head, or nil when the session is missing; an ack past it is refused (rule 5)
local function head_for_ack(seq)
  local h = redis.call('HGET', meta, 'head')
  if not h then return nil, missing() end
  local head = tonumber(h)
  if seq > head then
    return nil, {'err', 'ack_after_head', string.format('cannot ack %d: head is %d', seq, head)}
  end
  return head, nil
end
local function set_cursor(name, seq, uses)
  redis.call('HSET', cursors, name, string.format('%d:%d', seq, uses))
end
"""

#: ARGV: handler, text, handled ('1': the text is the result), ts, key ('' for none),
#: max_keys, origin (the publishing daemon, so it can skip its own wakes)
RECORD = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'head', 'limit', 'evals')
if not m[1] then return missing() end
local evals = tonumber(m[3]) + 1
local key = ARGV[5]
if key ~= '' then
  local seq = redis.call('HGET', keys, key)
  if seq then
    redis.call('HSET', meta, 'evals', evals)
    return {'ok', tonumber(seq), 1}
  end
end
local head = tonumber(m[1]) + 1
local limit = tonumber(m[2])
if limit > 0 then
  local field = 'e'
  if ARGV[3] == '1' then field = 'r' end
  redis.call('XADD', ring, 'MAXLEN', '=', limit, string.format('%d-0', head),
    't', ARGV[4], 'h', ARGV[1], field, ARGV[2])
end
if key ~= '' then
  redis.call('HSET', keys, key, head)
  if redis.call('RPUSH', keyorder, key) > tonumber(ARGV[6]) then
    redis.call('HDEL', keys, redis.call('LPOP', keyorder))
  end
end
redis.call('HSET', meta, 'head', head, 'evals', evals)
redis.call('SPUBLISH', wake, string.format('%d %s', head, ARGV[7]))
return {'ok', head, 0}
"""
)

#: ARGV: mode ('after', 'cursor' or 'poll'), after (for 'after') or the cursor's name,
#: max ('' for none), touch ('1': the read is a use of its cursor), max_cursors
READ = (
    _PRELUDE
    + """
local h = redis.call('HGET', meta, 'head')
if not h then return missing() end
local mode, touch, max_cursors = ARGV[1], ARGV[4] == '1', tonumber(ARGV[5])
local head = tonumber(h)
local after
if mode == 'after' then
  after = tonumber(ARGV[2])
else
  after = cursor_seq(redis.call('HGET', cursors, ARGV[2]))
end
if after > head then
  local what = mode == 'after' and 'after' or 'cursor'
  return {'err', 'cursor_after_head', string.format('%s %d is after head %d', what, after, head)}
end
local max = nil
if ARGV[3] ~= '' then
  max = tonumber(ARGV[3])
  if max < 1 then return {'err', 'bad_max', string.format('max %d is below 1', max)} end
end
local first = head - redis.call('XLEN', ring) + 1
local lost = math.max(0, math.min(first, head + 1) - after - 1)
local start = math.max(after + 1, first)
local stop = head + 1
if max then stop = math.min(head + 1, start + max) end
local entries = {}
local next = after + lost
if stop > start then
  entries = redis.call('XRANGE', ring,
    string.format('%d-0', start), string.format('%d-0', stop - 1))
  next = stop - 1
end
if mode == 'poll' then
  local seq, uses = use(ARGV[2], max_cursors)
  set_cursor(ARGV[2], math.max(seq, next), uses)
elseif mode == 'cursor' and touch then
  local seq, uses = use(ARGV[2], max_cursors)
  set_cursor(ARGV[2], seq, uses)
end
redis.call('HINCRBY', meta, 'evals', 1)
return {'ok', next, lost, entries}
"""
)

#: ARGV: cursor, seq (>= 0: the caller checked), max_cursors
ACK = (
    _PRELUDE
    + """
local seq = tonumber(ARGV[2])
local _, refused = head_for_ack(seq)
if refused then return refused end
local current, uses = use(ARGV[1], tonumber(ARGV[3]))
local moved = math.max(current, seq)
set_cursor(ARGV[1], moved, uses)
redis.call('HINCRBY', meta, 'evals', 1)
return {'ok', moved}
"""
)

#: ARGV: seq (>= 0). Checks an ack without making it (a wait's acks on several sessions).
CHECK_ACK = (
    _PRELUDE
    + """
local _, refused = head_for_ack(tonumber(ARGV[1]))
if refused then return refused end
return {'ok'}
"""
)

#: ARGV: limit (checked by the caller)
SET_LIMIT = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
local before = redis.call('XLEN', ring)
redis.call('XTRIM', ring, 'MAXLEN', '=', tonumber(ARGV[1]))
redis.call('HSET', meta, 'limit', ARGV[1])
redis.call('HINCRBY', meta, 'evals', 1)
return {'ok', before - redis.call('XLEN', ring)}
"""
)

#: no ARGV: the figures of ``sessions`` and ``stats`` and the cursor table; not an evaluation
DESCRIBE = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
local m = redis.call('HMGET', meta, 'head', 'limit', 'evals')
return {'ok', tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), redis.call('XLEN', ring),
  redis.call('HGETALL', cursors)}
"""
)

#: ARGV: limit
START = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 1 then return {'ok', 0} end
redis.call('DEL', ring, cursors, keys, keyorder)
redis.call('HSET', meta, 'limit', ARGV[1], 'head', 0, 'uses', 0, 'evals', 0)
return {'ok', 1}
"""
)

#: ARGV: origin
STOP = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
redis.call('DEL', meta, ring, cursors, keys, keyorder)
redis.call('SPUBLISH', wake, 'stop ' .. ARGV[1])
return {'ok'}
"""
)
