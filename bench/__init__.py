"""The repl benchmark: the daemon measured against Redis Streams and a bare asyncio floor.

Run it with ``python -m bench`` (``--quick`` for a few-second version); see
docs/benchmarks.md for what each figure means and the latest tables (the
second one: several daemons sharing sessions through one Redis).
"""
