"""The commands of ``repl``, a module an area, each loaded only when one of its commands
runs (``repl_cli.cli.main.COMMANDS`` names where each is)."""
