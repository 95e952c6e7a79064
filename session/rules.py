"""The numbers and names of the product's rules, written once (rules S1-S17 of docs/semantics.md).

Everything that states a rule's constant lives here: the core checks them,
the wire and the CLI take their defaults from here, and a store that must
apply a bound (the dedup window, say) is handed the value from here rather
than writing it again. Keep this module free of imports: the CLI loads it
on every run.
"""

from __future__ import annotations

#: the ring's bound when a session is started without one (rule 2)
DEFAULT_LIMIT = 256
#: the largest ring bound a session may have (rule 2)
MAX_LIMIT = 65_536
#: cursors per session; a 17th evicts the least recently used (rule 4)
MAX_CURSORS = 16
#: dedup keys a session remembers, newest first (rule 13)
MAX_KEYS = 1024
#: a dedup key's length, in characters
MAX_KEY_LENGTH = 256
#: a cursor or handler name's length, in characters (rule 4)
MAX_NAME_LENGTH = 64

#: what a send is recorded as unless it names another handler
DEFAULT_HANDLER = "on-message"
#: what a recurring timer records unless it names another handler (rules T1-T6)
TICK_HANDLER = "on-tick"
#: the handlers every session has: their result is the text itself
HANDLERS = frozenset({DEFAULT_HANDLER, TICK_HANDLER})

# The default cursors of rule 6: each CLI verb reads through its own, so a
# monitor, a person and a terminal stream never interfere; ``poll`` belongs
# to the drain of rule 7.
READ_CURSOR = "read"
WAIT_CURSOR = "wait"
FOLLOW_CURSOR = "follow"
POLL_CURSOR = "poll"
#: the cursor ``ack`` moves when none is named (the one ``read`` uses)
ACK_CURSOR = READ_CURSOR
#: the most session ids one wait may name (rule 14), counted as given: a wait on one
#: session named 100,000 times is refused, not read 100,000 times over; a session named
#: twice is waited on once, where it was first named
MAX_WAIT_SESSIONS = 1_024
#: the most correlation ids one gather names (SPEC §18)
MAX_CORRS = 1_024

#: the most timers one session may have pending (rules T1-T6)
MAX_TIMERS = 1024
#: the shortest interval of a recurring timer, in milliseconds
MIN_EVERY_MS = 1000

#: the rights a scoped token may be given (rules K1-K5; ``session.scopes`` checks them)
READ, SEND, ADMIN = "read", "send", "admin"

#: what a webhook's delivery is recorded as unless the webhook names another (rules H1-H7)
WEBHOOK_HANDLER = "on-webhook"
#: a webhook secret's length, in characters
MAX_SECRET_LENGTH = 256

#: the groups a session may have (SPEC §16), and the group a claim takes from by default
MAX_GROUPS = 16
DEFAULT_GROUP = "work"
#: a lease's length unless the claim names another, and its bounds (ms)
DEFAULT_LEASE_MS = 60_000
MIN_LEASE_MS = 1_000
MAX_LEASE_MS = 86_400_000
#: the longest delay a release may give (0: claimable again at once)
MAX_DELAY_MS = 86_400_000
#: the attempts a firing is given before it is dead, and the most a group may give
DEFAULT_MAX_ATTEMPTS = 5
MAX_MAX_ATTEMPTS = 1_000
#: what a session's default dead-letter session is called: its id and this
DEAD_SUFFIX = ".dead"
#: the id a session's groups' next lease deadline or delay end is scheduled under, beside
#: its timers: no timer's id, which has no space
GROUPS_TIMER = " groups"
