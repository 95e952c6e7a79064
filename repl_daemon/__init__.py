"""The daemon: ``engine`` (requests in, the core's operations run, answers out), the
``backends`` that keep sessions (local: memory or SQLite; Redis), ``server`` (the line
protocol), ``http`` (the HTTP API), ``daemon`` (start-up, signals, shutdown).

A rule cited by its id (S8, T2, D9, H1, ...) is docs/semantics.md's.
"""
