"""The end-to-end tests share the fixtures of tests/conftest.py (``redis_server`` among them)."""
