"""The Python APIs' operations, written once, async (``scripts/unasync.py`` writes the twin)."""
