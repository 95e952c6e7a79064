"""The backends: each kind of store with the committer that keeps sessions in it, behind
the one interface the engine knows (``repl_daemon.engine.committer.Backend``).

- ``local``: this daemon's memory is the truth, made durable by group commit into a
  store of its own (``memory``: nothing kept; ``sqlite``: the default);
- ``redis``: Redis (one server or a Redis Cluster) is the only copy, shared by every
  daemon pointed at it.

Nothing outside this package imports a backend by name but ``repl_daemon.daemon``,
which picks one for a config (``open_backend``), and the tests.
"""
