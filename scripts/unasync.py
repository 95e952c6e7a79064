"""Writes the blocking API's operations from the async ones: api/_async -> api/_sync.

The Python APIs' operations are written once, async, in ``repl_cli/api/_async/``;
this rewrites each module there, word by word, into ``repl_cli/api/_sync/``
(``async def`` -> ``def``, ``await x`` -> ``x``, ``AsyncOperations`` ->
``Operations``, ``aclose`` -> ``close``, ...), and formats the result with
ruff as the rest of the code is. httpcore keeps its connection code so
(its ``scripts/unasync.py``); this is the same idea, written for ours.

Usage: python scripts/unasync.py            write repl_cli/api/_sync/
       python scripts/unasync.py --check    exit 1, naming the file, if one is stale
                                            (scripts/check runs this)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "repl_cli" / "api" / "_async"
TARGET = ROOT / "repl_cli" / "api" / "_sync"

#: each rewrite, a whole word (or the words given) at a time
WORDS: tuple[tuple[str, str], ...] = (
    (r"AsyncIterator", "Iterator"),
    # an async generator's type has no return type; a generator's has one: None
    (r"AsyncGenerator\[([^\[\]]+)\]", r"Generator[\1, None]"),
    (r"AsyncGenerator", "Generator"),
    (r"asend", "send"),
    (r"Async([A-Z]\w*)", r"\1"),
    (r"async def", "def"),
    (r"async with", "with"),
    (r"async for", "for"),
    (r"await ", ""),
    (r"aclose", "close"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"repl_cli\.api\._async", "repl_cli.api._sync"),
)
#: comments that only async code needs (ruff would call them unused in the blocking twin)
DROPPED = re.compile(r"  # noqa: ASYNC\d+[^\n]*")
COMPILED = [(re.compile(rf"\b{pattern}"), by) for pattern, by in WORDS]
#: the generated module's docstring, in place of the source's (which speaks of the source)
HEADER = '''"""Written by scripts/unasync.py from repl_cli/api/_async/{name}: edit that one.

The blocking twin of the async source; ``python scripts/unasync.py`` writes
it again, and ``scripts/check`` fails while it is stale.
"""
'''
#: a module's docstring, at its start
DOCSTRING = re.compile(r'\A"""(?:.|\n)*?"""\n')


def unasync(text: str, name: str) -> str:
    text = DOCSTRING.sub("", text, count=1)
    text = DROPPED.sub("", text)
    for pattern, by in COMPILED:
        text = pattern.sub(by, text)
    return HEADER.format(name=name) + text


def ruff(args: list[str], text: str, name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET / name), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"unasync: ruff {args[0]} failed on the rewritten {name}:\n{done.stderr}")
    return done.stdout


def formatted(text: str, name: str) -> str:
    """``text`` as ruff leaves it: imports sorted again (``AsyncIterator`` became
    ``Iterator``), and formatted (lines that lost their awaits may now join)."""
    text = ruff(["check", "--select", "I", "--fix", "--quiet"], text, name)
    return ruff(["format"], text, name)


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for source in sorted(SOURCE.glob("*.py")):
        wanted = formatted(unasync(source.read_text(), source.name), source.name)
        target = TARGET / source.name
        if target.exists() and target.read_text() == wanted:
            continue
        if check:
            stale.append(target.relative_to(ROOT).as_posix())
        else:
            target.write_text(wanted)
            print(f"unasync: wrote {target.relative_to(ROOT)}")
    for extra in sorted(TARGET.glob("*.py")):
        if not (SOURCE / extra.name).exists():
            stale.append(f"{extra.relative_to(ROOT).as_posix()} (no source)")
    if stale:
        print(
            f"unasync: stale: {', '.join(stale)}: run `python scripts/unasync.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
