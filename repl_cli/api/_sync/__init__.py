"""Written by scripts/unasync.py from repl_cli/api/_async/__init__.py: edit that one.

The blocking twin of the async source; ``python scripts/unasync.py`` writes
it again, and ``scripts/check`` fails while it is stale.
"""
