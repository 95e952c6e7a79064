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

1. ``meta``     hash: ``limit``, ``head``, ``uses`` (the cursor-use clock), ``evals``,
   ``inc`` (the incarnation: a random token each start writes, answered with the
   head so a daemon can tell a restarted session from a head Redis took back,
   ``repl_daemon.backends.redis.heads``), and ``hook_secret``, ``hook_handler`` when the
   session has a webhook (rules H1-H7)
2. ``ring``     stream: the retained firings, entry id ``SEQ-0``; fields ``t`` (ts),
   ``h`` (handler), then ``r`` (result) or ``e`` (event), then ``g`` (its tags, a JSON
   object made by the daemon) only when it has tags, so a plain firing costs no more,
   then ``b`` (who sent it, its ``by``) when known (an entry written before senders has
   none, and reads back with ``by`` None)
3. ``cursors``  hash: name -> ``SEQ:LAST_USE``
4. ``keys``     hash: dedup key -> seq
5. ``keyorder`` list: the dedup keys, oldest first
6. ``wake``     the session's shard channel: every new firing publishes its
   seq there, a stop publishes ``stop`` (SPUBLISH, so the message stays on
   the session's own shard of a cluster)
7. ``timers``   hash: timer id -> its definition, JSON made by the daemon:
   ``every`` (ms, null for a one-shot), ``handler``, ``text``, ``key``,
   ``field`` (``r``: the text is the result, ``e``: the event), and ``tags`` when
   it has some: what its firings carry, as the JSON text their ``g`` field keeps
   (copied as it is, so the firing has the tags in the order they were given)
8. ``due``      sorted set: timer id, scored by when it is due (ms since the epoch)
9. ``groups``   hash: group name -> the group's state, MessagePack (SPEC §16,
   ``repl_daemon.backends.redis.group_scripts``)
10. ``outbox``  list: dead letters a group's step left, to record in their dead-letter
   sessions (another session: another slot of a cluster), oldest first

Timers are the session's own (rules T1-T6), so the script that fires one also
records its firing: one atomic step, which is what makes a due time fire
exactly once however many daemons try (``FIRE`` fires only what is still
due). Which timers are due across sessions is a hint kept beside them: a
sorted set per partition (``repl:{~tN}:due``, members ``SESSION TIMER``),
which the daemons claim from (``CLAIM``: a claimed entry moves a lease
ahead, so another daemon takes it only if the claimer died) and update
after each change (``INDEX``, which publishes on the partition's channel
when the partition's earliest due time moved sooner, so every daemon sleeps
until the earliest and none polls). An entry of the index that is stale
costs one ``FIRE`` that fires nothing; see ``repl_daemon.backends.redis.store``.

The scoped tokens (rules K1-K5) are kept apart from every session, under the
name ``~auth`` (no session id starts with ``~``): ``repl:{~auth}:names``
(name -> the SHA-256 of its secret), ``repl:{~auth}:tokens`` (that digest ->
the token's record, JSON made by the daemon) and the channel
``repl:{~auth}:wake``, where a revocation publishes ``revoked DIGEST`` so
every daemon ends that token's connections at once.

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
local timers, due = KEYS[7], KEYS[8]
local groups, outbox = KEYS[9], KEYS[10]
local function missing()
  return {'err', 'no_such_session', 'no session'}
end
local function cursor_seq(value)
  if not value then return 0 end
  return tonumber(string.match(value, '^(%d+)'))
end
-- a use of a cursor (rule S4) whose stored value is ``value`` (nil: it is new), at the
-- cursor-use clock ``uses``: the clock ticks, and a new cursor evicts the least recently
-- used one when the session has max_cursors. Answers the cursor's seq (a new one's is 0)
-- and the clock after the use, which the caller writes back with the session's figures
local function use(name, value, uses, max_cursors)
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
  return cursor_seq(value), uses + 1
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
-- what a match (JSON made by the daemon, ``session.tags.Match``) holds for: a function of
-- a ring entry's flat fields (``Match.holds``); the key 'by' is the firing's sender (its
-- ``b`` field), never a tag
local function matcher(json)
  local want = cjson.decode(json)
  local want_handler, want_tags = want.handler, want.tags
  if want_handler == cjson.null then want_handler = nil end
  if want_tags == nil or want_tags == cjson.null or next(want_tags) == nil then
    want_tags = nil
  end
  return function(fields)
    local handler, tags, by = nil, nil, nil
    for i = 1, #fields, 2 do
      if fields[i] == 'h' then handler = fields[i + 1]
      elseif fields[i] == 'g' then tags = fields[i + 1]
      elseif fields[i] == 'b' then by = fields[i + 1] end
    end
    if want_handler and handler ~= want_handler then return false end
    if want_tags then
      local have = nil
      for key, value in pairs(want_tags) do
        local got
        if key == 'by' then
          got = by
        elseif tags then
          if not have then have = cjson.decode(tags) end
          got = have[key]
        end  -- else a plain firing: no tags to decode
        if got == nil or (value ~= cjson.null and got ~= value) then return false end
      end
    end
    return true
  end
end
local function set_cursor(name, seq, uses)
  redis.call('HSET', cursors, name, string.format('%d:%d', seq, uses))
end
-- record a firing after head (rules S1, S2, S13): its seq, 1 if its key had one, the head;
-- ``tags`` is the JSON of its tags, '' for none (rules R1-R4); ``by`` who sent it, '' for
-- no one known (§17)
local function record(head, limit, field, handler, text, ts, key, max_keys, tags, by)
  if key ~= '' then
    local seq = redis.call('HGET', keys, key)
    if seq then return tonumber(seq), 1, head end
  end
  head = head + 1
  if limit > 0 then
    local entry = {'XADD', ring, 'MAXLEN', '=', limit, string.format('%d-0', head),
      't', ts, 'h', handler, field, text}
    if tags ~= '' then
      entry[#entry + 1] = 'g'
      entry[#entry + 1] = tags
    end
    if by ~= '' then
      entry[#entry + 1] = 'b'
      entry[#entry + 1] = by
    end
    redis.call(unpack(entry))
  end
  if key ~= '' then
    redis.call('HSET', keys, key, head)
    if redis.call('RPUSH', keyorder, key) > max_keys then
      redis.call('HDEL', keys, redis.call('LPOP', keyorder))
    end
  end
  return head, 0, head
end
"""

#: ARGV: handler, text, handled ('1': the text is the result), ts, key ('' for none),
#: max_keys, origin (the publishing daemon, so it can skip its own wakes), tags (JSON,
#: '' for none), by (its sender). Answers {'ok', seq, duplicate, head, incarnation,
#: retained (1 or 0)}.
#: A new firing the ring keeps is published whole on the wake channel, so a waiter that
#: is up to date is answered from the message with no read (``repl_daemon.backends.redis.
#: wakes.heard``): ``SEQ ORIGIN FIELD LEN(handler) LEN(ts) LEN(tags) LEN(by) INCARNATION``
#: (``-`` for a session made before incarnations), a newline, then the handler, the ts,
#: the tags, the sender and the text, one after the other. One it does not keep (a limit
#: of 0) is published as ``SEQ ORIGIN``, as a timer's firings are.
RECORD = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'head', 'limit', 'evals', 'inc')
if not m[1] then return missing() end
local field = 'e'
if ARGV[3] == '1' then field = 'r' end
local limit = tonumber(m[2])
local seq, duplicate, head = record(tonumber(m[1]), limit, field, ARGV[1], ARGV[2],
  ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[8], ARGV[9])
redis.call('HSET', meta, 'head', head, 'evals', tonumber(m[3]) + 1)
local retained = 1  -- (a duplicate's answer says 1, as the core's does)
if duplicate == 0 and limit == 0 then retained = 0 end
if duplicate == 0 and limit > 0 then
  redis.call('SPUBLISH', wake, string.format('%d %s %s %d %d %d %d %s\\n', head, ARGV[7],
    field, #ARGV[1], #ARGV[4], #ARGV[8], #ARGV[9], m[4] or '-')
    .. ARGV[1] .. ARGV[4] .. ARGV[8] .. ARGV[9] .. ARGV[2])
elseif duplicate == 0 then
  redis.call('SPUBLISH', wake, string.format('%d %s', head, ARGV[7]))
end
return {'ok', seq, duplicate, head, m[4], retained}
"""
)

#: ARGV: mode ('after', 'last', 'seq', 'cursor' or 'poll'); after (for 'after'; '' for the
#: whole retained ring), the N (for 'last': read after the head less N, in the same look),
#: the seq (for 'seq': read after it less 1; one after the head is refused) or the cursor's
#: name; max ('' for none), touch ('1': the read is a use of its
#: cursor), max_cursors, match (JSON made by the daemon, ``session.tags.Match``; '' for none),
#: ack (for 'cursor': the seq to ack the cursor to first, as ``AckRead`` does; '' for none),
#: owed (the evaluations of this daemon's looks answered from a published firing since its
#: last script on the session, counted now).
#: With a match only the firings it holds for come back, at most max of them, and next is
#: the last seq looked at: the last match when max stopped the look, else the head
#: (``Ring.events_after``). A look goes through the ring in pieces when max can stop it.
#: A look at the head (the waiter's usual turn) reads no part of the ring.
#: Answers {'ok', next, lost, entries, head, incarnation}.
READ = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'head', 'inc', 'uses', 'evals')
local h = m[1]
if not h then return missing() end
local mode, touch, max_cursors = ARGV[1], ARGV[4] == '1', tonumber(ARGV[5])
local head, uses = tonumber(h), tonumber(m[3])
local evals = tonumber(m[4]) + 1 + tonumber(ARGV[8])
local retained = nil
local function first()
  if not retained then retained = redis.call('XLEN', ring) end
  return head - retained + 1
end
local after, value
local ack = nil
if mode == 'last' then  -- the newest N: after the head less N, in this same look
  after = math.max(0, head - tonumber(ARGV[2]))
elseif mode == 'seq' then  -- one firing
  local seq = tonumber(ARGV[2])
  if seq > head then
    return {'err', 'cursor_after_head',
      string.format('no firing %d: its head is %d', seq, head)}
  end
  after = seq - 1
elseif mode ~= 'after' then
  value = redis.call('HGET', cursors, ARGV[2])
  after = cursor_seq(value)
  if ARGV[7] ~= '' then  -- the wait's ack, first (rule 5), made once every check passed
    ack = tonumber(ARGV[7])
    if ack > head then
      return {'err', 'ack_after_head', string.format('cannot ack %d: head is %d', ack, head)}
    end
    after = math.max(after, ack)
  end
elseif ARGV[2] == '' then
  after = first() - 1  -- just before the oldest retained: the whole ring, nothing lost
else
  after = tonumber(ARGV[2])
end
if after > head then
  local what = (mode == 'cursor' or mode == 'poll') and 'cursor' or 'after'
  return {'err', 'cursor_after_head', string.format('%s %d is after head %d', what, after, head)}
end
local max = nil
if ARGV[3] ~= '' then
  max = tonumber(ARGV[3])
  if max < 1 then return {'err', 'bad_max', string.format('max %d is below 1', max)} end
end
if ack then  -- every refusal is behind: the ack is a use of its cursor, which moves
  uses = select(2, use(ARGV[2], value, uses, max_cursors))
  set_cursor(ARGV[2], after, uses)
  value = string.format('%d:%d', after, uses)
  evals = evals + 1
end
local lost, start = 0, head + 1
if after < head then
  lost = math.max(0, math.min(first(), head + 1) - after - 1)
  start = math.max(after + 1, first())
end
local entries = {}
local last = after + lost
if ARGV[6] ~= '' then
  local holds = matcher(ARGV[6])
  if start <= head then
    last = head
    local from = start
    while from <= head do
      local piece
      if max then
        piece = redis.call('XRANGE', ring, string.format('%d-0', from),
          string.format('%d-0', head), 'COUNT', math.max(max - #entries, 128))
      else
        piece = redis.call('XRANGE', ring, string.format('%d-0', from),
          string.format('%d-0', head))
      end
      if #piece == 0 then break end
      local stopped = false
      for _, entry in ipairs(piece) do
        if holds(entry[2]) then
          entries[#entries + 1] = entry
          if max and #entries == max then
            last = tonumber(string.match(entry[1], '^(%d+)'))
            stopped = true
            break
          end
        end
      end
      if stopped or not max then break end
      from = tonumber(string.match(piece[#piece][1], '^(%d+)')) + 1
    end
  end
else
  local stop = head + 1
  if max then stop = math.min(head + 1, start + max) end
  if stop > start then
    entries = redis.call('XRANGE', ring,
      string.format('%d-0', start), string.format('%d-0', stop - 1))
    last = stop - 1
  end
end
if mode == 'poll' then
  local seq
  seq, uses = use(ARGV[2], value, uses, max_cursors)
  set_cursor(ARGV[2], math.max(seq, last), uses)
elseif mode == 'cursor' and touch then
  local seq
  seq, uses = use(ARGV[2], value, uses, max_cursors)
  set_cursor(ARGV[2], seq, uses)
end
redis.call('HSET', meta, 'uses', uses, 'evals', evals)
return {'ok', last, lost, entries, head, m[2]}
"""
)

#: ARGV: cursor, seq (>= 0: the caller checked), max_cursors
ACK = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'head', 'uses', 'evals')
if not m[1] then return missing() end
local seq, head = tonumber(ARGV[2]), tonumber(m[1])
if seq > head then
  return {'err', 'ack_after_head', string.format('cannot ack %d: head is %d', seq, head)}
end
local current, uses = use(ARGV[1], redis.call('HGET', cursors, ARGV[1]), tonumber(m[2]),
  tonumber(ARGV[3]))
local moved = math.max(current, seq)
set_cursor(ARGV[1], moved, uses)
redis.call('HSET', meta, 'uses', uses, 'evals', tonumber(m[3]) + 1)
return {'ok', moved}
"""
)

#: ARGV: the evaluations to count (a daemon's looks answered from published firings, told
#: when its subscription to the session's wakes ends); a session gone meanwhile is left gone
LOOKED = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 1 then
  redis.call('HINCRBY', meta, 'evals', tonumber(ARGV[1]))
end
return {'ok'}
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

#: ARGV: limit, incarnation (a random token)
START = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 1 then return {'ok', 0} end
redis.call('DEL', ring, cursors, keys, keyorder, timers, due, groups, outbox)
redis.call('HSET', meta, 'limit', ARGV[1], 'head', 0, 'uses', 0, 'evals', 0, 'inc', ARGV[2])
return {'ok', 1}
"""
)

#: ARGV: origin. Answers {'ok', {id, due, id, due, ...} of the timers that went with it}.
STOP = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
local cancelled = redis.call('ZRANGE', due, 0, -1, 'WITHSCORES')
redis.call('DEL', meta, ring, cursors, keys, keyorder, timers, due, groups, outbox)
redis.call('SPUBLISH', wake, 'stop ' .. ARGV[1])
return {'ok', cancelled}
"""
)

#: ARGV: id, due (ms), the definition (JSON), key ('' for none), max_timers. Answers
#: {'ok', id, due, duplicate, seq, definition}: a new timer, the pending one its key
#: made (duplicate 1), or the firing its key recorded (id and due '', seq set); the core's
#: ``Session.schedule``, whose messages the daemon gives the refusals.
SCHEDULE = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
local id, key = ARGV[1], ARGV[4]
if key ~= '' then
  local all = redis.call('HGETALL', timers)
  for i = 1, #all, 2 do
    if cjson.decode(all[i + 1]).key == key then
      redis.call('HINCRBY', meta, 'evals', 1)
      return {'ok', all[i], redis.call('ZSCORE', due, all[i]), 1, '', all[i + 1]}
    end
  end
  local seq = redis.call('HGET', keys, key)
  if seq then
    redis.call('HINCRBY', meta, 'evals', 1)
    return {'ok', '', '', 1, seq, ''}
  end
end
if redis.call('HEXISTS', timers, id) == 1 then return {'err', 'bad_time', id} end
if redis.call('HLEN', timers) >= tonumber(ARGV[5]) then return {'err', 'too_many', id} end
redis.call('HSET', timers, id, ARGV[3])
redis.call('ZADD', due, ARGV[2], id)
redis.call('HINCRBY', meta, 'evals', 1)
return {'ok', id, ARGV[2], 0, '', ARGV[3]}
"""
)

#: ARGV: id. Answers {'ok', definition, due}, or the refusal ``no_such_timer``.
CANCEL = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
local def = redis.call('HGET', timers, ARGV[1])
if not def then return {'err', 'no_such_timer', ARGV[1]} end
local when = redis.call('ZSCORE', due, ARGV[1])
redis.call('HDEL', timers, ARGV[1])
redis.call('ZREM', due, ARGV[1])
redis.call('HINCRBY', meta, 'evals', 1)
return {'ok', def, when}
"""
)

#: no ARGV: {'ok', id, definition, due, ...} of every pending timer; not an evaluation
TIMERS = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
local out = {'ok'}
local all = redis.call('ZRANGE', due, 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  out[#out + 1] = all[i]
  out[#out + 1] = redis.call('HGET', timers, all[i])
  out[#out + 1] = all[i + 1]
end
return out
"""
)

#: ARGV: now (ms), ts, max_keys, origin, then the ids of the timers to fire. Fires
#: each that is still due, earliest first (``Session.fire_timers``): its firing
#: recorded (a one-shot's with its key), the timer deleted or moved to the first
#: point of its grid after now. Answers {'ok', {id, seq or -1, due or -1}, ...}
#: for every id asked, -1 meaning none.
FIRE = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'head', 'limit', 'evals')
if not m[1] then return missing() end
local head, limit, evals = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]) + 1
local now, ts, max_keys = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local pending, seen = {}, {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local when = redis.call('ZSCORE', due, id)
  if when and not seen[id] then
    pending[#pending + 1] = {tonumber(when), id}
  end
  seen[id] = true
end
table.sort(pending, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local fired = {}
local recorded = false
for _, p in ipairs(pending) do
  local when, id = p[1], p[2]
  if when <= now then
    local def = cjson.decode(redis.call('HGET', timers, id))
    local every = def.every
    local key = ''
    if every == cjson.null and def.key ~= cjson.null then key = def.key end
    local seq, duplicate
    local tags = def.tags
    if tags == nil or tags == cjson.null then tags = '' end
    seq, duplicate, head = record(head, limit, def.field, def.handler, def.text, ts, key,
      max_keys, tags, 'timer')
    evals = evals + 1
    if duplicate == 0 then recorded = true end
    local next_due = -1
    if every == cjson.null then
      redis.call('HDEL', timers, id)
      redis.call('ZREM', due, id)
    else
      next_due = when + (math.floor((now - when) / every) + 1) * every
      redis.call('ZADD', due, string.format('%d', next_due), id)
    end
    fired[id] = {seq, next_due}
  end
end
redis.call('HSET', meta, 'head', head, 'evals', evals)
if recorded then
  redis.call('SPUBLISH', wake, string.format('%d %s', head, ARGV[4]))
end
local out = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local f = fired[id]
  if f then
    out[#out + 1] = {id, f[1], f[2]}
  else
    local when = redis.call('ZSCORE', due, id)
    out[#out + 1] = {id, -1, when and tonumber(when) or -1}
  end
end
return {'ok', out}
"""
)

# The partition scripts: KEYS are the partition's index (a sorted set) and its channel.

#: ARGV: now (ms), lease_until (ms), max. The entries due at now (at most max) move to
#: lease_until, claimed; answers {'ok', members, the earliest due left ('' for none)}.
CLAIM = """#!lua
local index = KEYS[1]
local due = redis.call('ZRANGEBYSCORE', index, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, member in ipairs(due) do
  redis.call('ZADD', index, ARGV[2], member)
end
local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
return {'ok', due, first[2] or ''}
"""

#: ARGV: origin, the number of entries to lower, the number to set, then (member, due)
#: each of those (an entry lowered only ever moves sooner, or is added), then (member,
#: expected, due) for each entry to set and (member, expected) for each to remove: set or
#: removed only while its score is still ``expected`` (the lease its claimer wrote, or
#: the due time it was indexed at; '' for any), so a late writer never undoes a newer
#: entry. Publishes the partition's earliest due time on its channel when it moved
#: sooner; answers {'ok', the earliest due ('' for none)}.
INDEX = """#!lua
local index, channel = KEYS[1], KEYS[2]
local before = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')[2]
local lower, set = tonumber(ARGV[2]), tonumber(ARGV[3])
local function still(member, expected)
  if expected == '' then return true end
  local score = redis.call('ZSCORE', index, member)
  return score and tonumber(score) == tonumber(expected)
end
local i = 4
for _ = 1, lower do
  redis.call('ZADD', index, 'LT', ARGV[i + 1], ARGV[i])
  i = i + 2
end
for _ = 1, set do
  if still(ARGV[i], ARGV[i + 1]) then
    redis.call('ZADD', index, ARGV[i + 2], ARGV[i])
  end
  i = i + 3
end
while i < #ARGV do
  if still(ARGV[i], ARGV[i + 1]) then
    redis.call('ZREM', index, ARGV[i])
  end
  i = i + 2
end
local after = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')[2]
if after and (not before or tonumber(after) < tonumber(before)) then
  redis.call('SPUBLISH', channel, 'due ' .. after .. ' ' .. ARGV[1])
end
return {'ok', after or ''}
"""

#: ARGV: secret ('' to take the webhook away), handler
SET_WEBHOOK = (
    _PRELUDE
    + """
if redis.call('EXISTS', meta) == 0 then return missing() end
if ARGV[1] == '' then
  redis.call('HDEL', meta, 'hook_secret', 'hook_handler')
else
  redis.call('HSET', meta, 'hook_secret', ARGV[1], 'hook_handler', ARGV[2])
end
redis.call('HINCRBY', meta, 'evals', 1)
return {'ok'}
"""
)

#: no ARGV: {'ok', secret, handler} ('' for no webhook); not an evaluation
GET_WEBHOOK = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'head', 'hook_secret', 'hook_handler')
if not m[1] then return missing() end
return {'ok', m[2] or '', m[3] or ''}
"""
)


# -- the scoped tokens: KEYS names, tokens, wake ---------------------------------

#: ARGV: name, digest, record (JSON), the most tokens kept
TOKEN_ADD = """#!lua
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {'err', 'token_exists', ARGV[1]} end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return {'err', 'too_many', ''} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return {'ok'}
"""

#: ARGV: name; answers the revoked token's record
TOKEN_REVOKE = """#!lua
local digest = redis.call('HGET', KEYS[1], ARGV[1])
if not digest then return {'err', 'no_such_token', ARGV[1]} end
local record = redis.call('HGET', KEYS[2], digest)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], digest)
redis.call('SPUBLISH', KEYS[3], 'revoked ' .. digest)
return {'ok', record or ''}
"""

#: ARGV: digest ('' for every token); answers the records found
TOKEN_FIND = """#!lua
if ARGV[1] == '' then
  local out = {'ok'}
  for _, record in ipairs(redis.call('HVALS', KEYS[2])) do out[#out + 1] = record end
  return out
end
local record = redis.call('HGET', KEYS[2], ARGV[1])
if not record then return {'ok'} end
return {'ok', record}
"""
