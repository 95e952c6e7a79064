"""The Lua scripts of groups and claims (SPEC §16) in the Redis store: one a step.

Each step of ``session.group`` (claim, done, release, extend, expire, a group's
settings, its counts) is one script on the session's keys (``scripts``' order,
with ``groups`` and ``outbox`` last), so it is one atomic step in Redis however
many daemons claim: exactly one claimer gets a firing. The rules are the core's,
restated because Redis must apply them itself; ``tests/stores/
test_redis_differential.py`` holds these scripts to ``session.group``.

A group is one field of the ``groups`` hash, its state one MessagePack array
(``cmsgpack``, exact for integers): ``{done_through, dead, lost, max_attempts,
dead_letter ('' for the default), done_above, leases (seq, attempt, until, ...),
delays (seq, ready_at, attempts, ...), tries (seq, attempts, ...), dead_seqs}``,
each list sorted by seq (``GroupSnapshot``'s order: ``decode_group`` reads it; a
group written before ``dead_seqs`` has nine, and none).

A firing whose last attempt dies is done for its group here, and its dead letter
is pushed to the session's ``outbox`` in the same script: ``{dead_letter (''
for the default), group, seq, attempts, the ring entry's fields}``. The
dead-letter session is another session (another slot of a cluster), so the
daemon records it there next (``RECORD`` with a key made of the four, so that a
retry records nothing twice) and takes it off the outbox; every script of a group
answers the outbox's length, so a dead letter a crash left there is recorded by
the next daemon that steps the session's groups.

A refusal of a stale claim is ``{'err', 'lease_lost', WHY ...}``: the daemon words
it as the core does (``session.group.lease_lost``).
"""

from __future__ import annotations

from repl_daemon.backends.redis.scripts import _PRELUDE

_GROUPS = """
local function decode_group(name, raw)
  local s = cmsgpack.unpack(raw)
  local g = {name = name, t = s[1], x = s[2], o = s[3], m = s[4], q = s[5],
    a = {}, l = {}, d = {}, r = {}, k = {}}
  for _, seq in ipairs(s[6]) do g.a[seq] = true end
  for _, seq in ipairs(s[10] or {}) do g.k[seq] = true end
  local l, d, r = s[7], s[8], s[9]
  for i = 1, #l, 3 do g.l[l[i]] = {l[i + 1], l[i + 2]} end
  for i = 1, #d, 3 do g.d[d[i]] = {d[i + 1], d[i + 2]} end
  for i = 1, #r, 2 do g.r[r[i]] = r[i + 1] end
  return g
end
local function load_group(name)
  local raw = redis.call('HGET', groups, name)
  if not raw then return nil end
  return decode_group(name, raw)
end
local function seqs_of(t)
  local out = {}
  for seq in pairs(t) do out[#out + 1] = seq end
  table.sort(out)
  return out
end
local function save_group(g)
  local a, l, d, r = seqs_of(g.a), {}, {}, {}
  for _, seq in ipairs(seqs_of(g.l)) do
    l[#l + 1] = seq; l[#l + 1] = g.l[seq][1]; l[#l + 1] = g.l[seq][2]
  end
  for _, seq in ipairs(seqs_of(g.d)) do
    d[#d + 1] = seq; d[#d + 1] = g.d[seq][1]; d[#d + 1] = g.d[seq][2]
  end
  for _, seq in ipairs(seqs_of(g.r)) do
    r[#r + 1] = seq; r[#r + 1] = g.r[seq]
  end
  redis.call('HSET', groups, g.name, cmsgpack.pack({g.t, g.x, g.o, g.m, g.q, a, l, d, r,
    seqs_of(g.k)}))
end
local function compact(g)
  while g.a[g.t + 1] do
    g.a[g.t + 1] = nil
    g.t = g.t + 1
  end
end
-- the ring holds nothing below first: what is not done there is lost (told by the next
-- claim) and done (``Group.trim``); g.trimmed says it changed the group
local function trim(g, first)
  for _, seq in ipairs(seqs_of(g.k)) do
    if seq < first then
      g.k[seq] = nil
      g.trimmed = true
    end
  end
  if first - 1 <= g.t then return end
  g.trimmed = true
  local below = 0
  for _, t in ipairs({g.a, g.l, g.d, g.r}) do
    for _, seq in ipairs(seqs_of(t)) do
      if seq < first then
        if t == g.a then below = below + 1 end
        t[seq] = nil
      end
    end
  end
  g.o = g.o + first - 1 - g.t - below
  g.t = first - 1
  compact(g)
end
local function mark_done(g, seq)
  if seq == g.t + 1 then
    g.t = seq
    compact(g)
  else
    g.a[seq] = true
  end
end
local function entry_at(seq)
  local found = redis.call('XRANGE', ring, string.format('%d-0', seq), string.format('%d-0', seq))
  return found[1]
end
-- the firing's last attempt: done, counted, and its dead letter in the outbox
local function die(g, seq, attempts)
  local entry = entry_at(seq)
  mark_done(g, seq)
  g.x = g.x + 1
  g.k[seq] = true
  redis.call('RPUSH', outbox, cmsgpack.pack({g.q, g.name, seq, attempts, entry[2]}))
end
local function deadline(g)
  local soonest = nil
  for _, v in pairs(g.l) do
    if not soonest or v[2] < soonest then soonest = v[2] end
  end
  for _, v in pairs(g.d) do
    if not soonest or v[1] < soonest then soonest = v[1] end
  end
  return soonest
end
-- every lease that ran out by now is claimable again, or dead at its last attempt; every
-- delay that ended makes its seq claimable; answers the seqs claimable again
local function expire(g, now, first)
  local again = {}
  local soonest = deadline(g)
  if soonest == nil or soonest > now then return again end
  trim(g, first)
  for _, seq in ipairs(seqs_of(g.l)) do
    local lease = g.l[seq]
    if lease[2] <= now then
      g.l[seq] = nil
      if lease[1] >= g.m then
        die(g, seq, lease[1])
      else
        g.r[seq] = lease[1]
        again[#again + 1] = seq
      end
    end
  end
  for _, seq in ipairs(seqs_of(g.d)) do
    local delay = g.d[seq]
    if delay[1] <= now then
      g.r[seq] = delay[2]
      g.d[seq] = nil
      again[#again + 1] = seq
    end
  end
  return again
end
local function ring_first(head)
  return head - redis.call('XLEN', ring) + 1
end
-- the live lease of (seq, attempt) at now, or the refusal (``Group.live``)
local function live(g, seq, attempt, now)
  local lease = g.l[seq]
  if lease == nil then return {'err', 'lease_lost', 'not_held'} end
  if lease[1] ~= attempt then return {'err', 'lease_lost', 'attempt ' .. lease[1]} end
  if lease[2] <= now then
    return {'err', 'lease_lost', string.format('ran_out %d', lease[2])}
  end
  return nil
end
local function group_deadline()
  local soonest = nil
  for _, name in ipairs(redis.call('HKEYS', groups)) do
    local d = deadline(load_group(name))
    if d and (not soonest or d < soonest) then soonest = d end
  end
  return soonest or -1
end
-- the group ``name``, or a new one (from the oldest firing, or after the head with
-- from_now) unless the session has max_groups, or whoever asks does not see the dead-letter
-- session the new group would have (sees ~= '1'): then the refusal
local function group_or_new(name, first, head, from_now, max_groups, max_attempts, sees)
  local g = load_group(name)
  if g ~= nil then return g, nil end
  if redis.call('HLEN', groups) >= tonumber(max_groups) then
    return nil, {'err', 'too_many', 'groups'}
  end
  if sees ~= '1' then return nil, {'err', 'forbidden', 'dead_letter'} end
  local start = first - 1
  if from_now then start = head end
  return {name = name, t = start, x = 0, o = 0, m = tonumber(max_attempts), q = '',
    a = {}, l = {}, d = {}, r = {}, k = {}}, nil
end
local function counts(g, first, head, now)
  local through = math.max(g.t, first - 1)
  while g.a[through + 1] do through = through + 1 end
  local done = math.max(0, math.min(through, head) - first + 1)
  for seq in pairs(g.a) do
    if seq > through and seq >= first and seq <= head then done = done + 1 end
  end
  local held, delayed = 0, 0
  for seq in pairs(g.l) do
    if seq >= first and seq <= head then held = held + 1 end
  end
  for seq, v in pairs(g.d) do
    if seq >= first and seq <= head and v[1] > now then delayed = delayed + 1 end
  end
  return {g.name, through, head - first + 1 - done - held - delayed, held, delayed, g.x, g.m, g.q}
end
"""

_GROUP = _PRELUDE + _GROUPS

#: ARGV: group, now, lease (ms), match (JSON, '' for none), from_now ('1'), max_groups,
#: max_attempts (a new group's), origin, whether the claimer sees the default dead-letter
#: session ('1'; else a group this claim would make is refused). Expires the group's
#: leases that ran out, then takes its oldest claimable firing that the match holds for
#: (``Groups.claim``).
#: Answers {'ok', seq (0: none), attempt, lease_until, lost, entry, outbox length,
#: the session's next group deadline (-1: none), claimable again (1 or 0)}.
_CLAIM = """
local m = redis.call('HMGET', meta, 'head', 'evals')
if not m[1] then return missing() end
local name, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local head = tonumber(m[1])
local first = math.min(ring_first(head), head + 1)
local g, refused = group_or_new(name, first, head, ARGV[5] == '1', ARGV[6], ARGV[7], ARGV[9])
if refused then return refused end
local again = expire(g, now, first)
trim(g, first)
local holds = nil
if ARGV[4] ~= '' then
  local test = matcher(ARGV[4])
  local matching = {}
  local from = math.max(g.t, first - 1) + 1
  if from <= head then
    local entries = redis.call('XRANGE', ring, string.format('%d-0', from),
      string.format('%d-0', head))
    for _, entry in ipairs(entries) do
      if test(entry[2]) then matching[tonumber(string.match(entry[1], '^(%d+)'))] = true end
    end
  end
  holds = matching
end
local seq = 0
for s = g.t + 1, head do
  if not g.a[s] and not g.l[s] then
    local delay = g.d[s]
    if (delay == nil or delay[1] <= now) and (holds == nil or holds[s]) then
      seq = s
      break
    end
  end
end
local attempt, lost, entry = 0, 0, {}
if seq > 0 then
  local delay = g.d[seq]
  if delay == nil then
    attempt = (g.r[seq] or 0) + 1
    g.r[seq] = nil
  else
    attempt = delay[2] + 1
    g.d[seq] = nil
  end
  g.l[seq] = {attempt, now + lease}
  lost = g.o
  g.o = 0
  entry = entry_at(seq)
end
save_group(g)
redis.call('HSET', meta, 'evals', tonumber(m[2]) + 1)
local freed = 0
if #again > 0 then
  freed = 1
  redis.call('SPUBLISH', wake, 'claimable ' .. ARGV[8])
end
return {'ok', seq, attempt, now + lease, lost, entry, redis.call('LLEN', outbox),
  group_deadline(), freed}
"""
CLAIM_GROUP = _GROUP + _CLAIM

#: ARGV: CLAIM_GROUP's nine, then the seq and attempt of the claim token to finish (of
#: the group ARGV[1]). ``done --next`` (``FinishNext``): the done as STEP_GROUP's
#: ``done`` does it, then the claim as CLAIM_GROUP does it, in one script (one write).
#: A stale claim is refused as STEP_GROUP refuses it, and nothing is claimed. Answers
#: CLAIM_GROUP's.
DONE_NEXT = (
    _GROUP
    + """
local dm = redis.call('HMGET', meta, 'head', 'evals')
if not dm[1] then return missing() end
local dseq, dattempt = tonumber(ARGV[10]), tonumber(ARGV[11])
local dg = load_group(ARGV[1])
if dg == nil then return {'err', 'lease_lost', 'no_group'} end
local dhead = tonumber(dm[1])
trim(dg, math.min(ring_first(dhead), dhead + 1))
local drefused = live(dg, dseq, dattempt, tonumber(ARGV[2]))
if drefused then
  if dg.trimmed then save_group(dg) end  -- what the ring dropped is gone all the same
  return drefused
end
dg.l[dseq] = nil
mark_done(dg, dseq)
redis.call('SPUBLISH', wake, 'grouped ' .. ARGV[8])  -- its joins look (SPEC §18)
save_group(dg)
redis.call('HSET', meta, 'evals', tonumber(dm[2]) + 1)
"""
    + _CLAIM
)

#: ARGV: step ('done', 'release' or 'extend'), group, seq, attempt, now, the step's one
#: length (ms: release's delay, extend's lease; done's 0), origin. A stale claim is
#: refused and changes nothing. Answers {'ok', the step's answer (done: the seq; release:
#: 1 when that was its last attempt; extend: the lease's end), outbox length, the
#: session's next group deadline (-1: none)}.
STEP_GROUP = (
    _GROUP
    + """
local m = redis.call('HMGET', meta, 'head', 'evals')
if not m[1] then return missing() end
local step, seq, attempt, now = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local g = load_group(ARGV[2])
if g == nil then return {'err', 'lease_lost', 'no_group'} end
local head = tonumber(m[1])
trim(g, math.min(ring_first(head), head + 1))
local refused = live(g, seq, attempt, now)
if refused then
  if g.trimmed then save_group(g) end  -- what the ring dropped is gone all the same
  return refused
end
local answer
if step == 'done' then
  g.l[seq] = nil
  mark_done(g, seq)
  answer = seq
  redis.call('SPUBLISH', wake, 'grouped ' .. ARGV[7])  -- its joins look (SPEC §18)
elseif step == 'release' then
  g.l[seq] = nil
  local delay = tonumber(ARGV[6])
  answer = 0
  if attempt >= g.m then
    die(g, seq, attempt)
    answer = 1
    redis.call('SPUBLISH', wake, 'grouped ' .. ARGV[7])
  elseif delay > 0 then
    g.d[seq] = {now + delay, attempt}
  else
    g.r[seq] = attempt
    redis.call('SPUBLISH', wake, 'claimable ' .. ARGV[7])
  end
else
  answer = now + tonumber(ARGV[6])
  g.l[seq] = {attempt, answer}
end
save_group(g)
redis.call('HSET', meta, 'evals', tonumber(m[2]) + 1)
return {'ok', answer, redis.call('LLEN', outbox), group_deadline()}
"""
)

#: ARGV: now, origin. Every group's leases that ran out and delays that ended by now (the
#: durable timer's step, ``ExpireGroups``). Answers {'ok', the seqs claimable again,
#: outbox length, the session's next group deadline (-1: none)}.
EXPIRE_GROUPS = (
    _GROUP
    + """
local m = redis.call('HMGET', meta, 'head', 'evals')
if not m[1] then return missing() end
local now, head = tonumber(ARGV[1]), tonumber(m[1])
local first = math.min(ring_first(head), head + 1)
local again = {}
local letters = redis.call('LLEN', outbox)
for _, name in ipairs(redis.call('HKEYS', groups)) do
  local g = load_group(name)
  local soonest = deadline(g)
  if soonest and soonest <= now then
    for _, seq in ipairs(expire(g, now, first)) do again[#again + 1] = seq end
    save_group(g)
  end
end
redis.call('HSET', meta, 'evals', tonumber(m[2]) + 1)
if #again > 0 then redis.call('SPUBLISH', wake, 'claimable ' .. ARGV[2]) end
if redis.call('LLEN', outbox) > letters then redis.call('SPUBLISH', wake, 'grouped ' .. ARGV[2]) end
return {'ok', again, redis.call('LLEN', outbox), group_deadline()}
"""
)

#: ARGV: group, now, max_attempts ('' to keep), dead_letter ('' to keep), from_now ('1'),
#: max_groups, max_attempts (a new group's), whether whoever asks sees the default
#: dead-letter session ('1'; else a group made without dead_letter is refused). Creates
#: the group (``repl group``) or sets what is given. Answers {'ok', its counts: name,
#: done, ready, held, delayed, dead, max_attempts, dead_letter ('' for the default)}.
CONFIGURE_GROUP = (
    _GROUP
    + """
local m = redis.call('HMGET', meta, 'head', 'evals')
if not m[1] then return missing() end
local name, now, head = ARGV[1], tonumber(ARGV[2]), tonumber(m[1])
local first = math.min(ring_first(head), head + 1)
local sees = ARGV[8]
if ARGV[4] ~= '' then sees = '1' end  -- a dead-letter session of its own: checked before
local g, refused = group_or_new(name, first, head, ARGV[5] == '1', ARGV[6], ARGV[7], sees)
if refused then return refused end
if ARGV[3] ~= '' then g.m = tonumber(ARGV[3]) end
if ARGV[4] ~= '' then g.q = ARGV[4] end
save_group(g)
redis.call('HSET', meta, 'evals', tonumber(m[2]) + 1)
return {'ok', counts(g, first, head, now)}
"""
)

#: ARGV: now, what ('groups': each group's counts; 'claims': the held firings), the group
#: ('' for every one). Not an evaluation. Answers {'ok', rows}: counts as
#: ``CONFIGURE_GROUP`` answers them, by name; or {group, seq, attempt, until} by group,
#: then seq.
GROUP_TABLE = (
    _GROUP
    + """
local m = redis.call('HMGET', meta, 'head')
if not m[1] then return missing() end
local now, head = tonumber(ARGV[1]), tonumber(m[1])
local first = math.min(ring_first(head), head + 1)
local names = redis.call('HKEYS', groups)
table.sort(names)
local rows = {}
for _, name in ipairs(names) do
  if ARGV[3] == '' or ARGV[3] == name then
    local g = load_group(name)
    if ARGV[2] == 'groups' then
      rows[#rows + 1] = counts(g, first, head, now)
    else
      for _, seq in ipairs(seqs_of(g.l)) do
        rows[#rows + 1] = {name, seq, g.l[seq][1], g.l[seq][2]}
      end
    end
  end
end
return {'ok', rows}
"""
)

#: ARGV: the group. What a join's look needs (``GroupProgress``): {'ok', the head, the
#: oldest seq the ring holds, the group as it is kept (false when there is none)}, for
#: the core to count (``Group.progress``); not an evaluation.
GROUP_STATE = (
    _GROUP
    + """
local m = redis.call('HMGET', meta, 'head')
if not m[1] then return missing() end
local head = tonumber(m[1])
local raw = redis.call('HGET', groups, ARGV[1])
return {'ok', head, math.min(ring_first(head), head + 1), raw}
"""
)

#: no ARGV: {'ok', the outbox's entries}, oldest first; not an evaluation
OUTBOX = (
    _PRELUDE
    + """
return {'ok', redis.call('LRANGE', outbox, 0, -1)}
"""
)

#: ARGV: an entry of the outbox, recorded in its dead-letter session: taken off (once)
OUTBOX_DONE = (
    _PRELUDE
    + """
return {'ok', redis.call('LREM', outbox, 1, ARGV[1])}
"""
)

#: the scripts of this module, as the store registers them
GROUP_SCRIPTS = (
    "CLAIM_GROUP",
    "DONE_NEXT",
    "STEP_GROUP",
    "EXPIRE_GROUPS",
    "CONFIGURE_GROUP",
    "GROUP_TABLE",
    "GROUP_STATE",
    "OUTBOX",
    "OUTBOX_DONE",
)
