"""A reader or a claimer whose stdout fails, whatever the failure: nothing is taken.

Three real kinds of write error, each met by the CLI run as a user runs it:
a full disk (stdout at ``/dev/full``: ENOSPC), a closed pipe (the pipe's
reader closed before the first line: EPIPE) and a broken terminal (a pty
whose master side is closed: EIO, what a shell's terminal window that was
closed leaves its jobs), and, part-way through the output, a file size
limit (``ulimit -f``: EFBIG once the file is that long). Rule 9 and SPEC
§16: ``read``, ``wait`` and ``follow`` acknowledge nothing they could not
write (and what they wrote before the failure, they do), and ``claim``
gives back at once what it took and could not write whole, so the next
claimer gets it (attempt 2) without waiting out the lease.
"""

from __future__ import annotations

import json
import os
import pty
import resource
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import Repl, repl_argv

KINDS = ("full disk", "closed pipe", "broken terminal")

# what each kind ends with: a reader gone is quiet (exit 0); any other failure is one line
ENDS = {
    "full disk": (1, "repl: cannot write to stdout (No space left on device)\n"),
    "closed pipe": (0, ""),
    "broken terminal": (1, "repl: cannot write to stdout (Input/output error)\n"),
}


@contextmanager
def failing_stdout(kind: str) -> Iterator[int]:
    """A file descriptor whose every write fails with ``kind``'s error."""
    if kind == "full disk":
        fd = os.open("/dev/full", os.O_WRONLY)
    elif kind == "closed pipe":
        reader, fd = os.pipe()
        os.close(reader)
    else:
        leader, fd = pty.openpty()
        os.close(leader)  # the terminal is gone: writes to its other side fail with EIO
    try:
        with pytest.raises(OSError):
            os.write(fd, b"probe\n")  # the kind is real here, not just in the test's name
        yield fd
    finally:
        os.close(fd)


def run_into(repl: Repl, kind: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    with failing_stdout(kind) as fd:
        return run(repl, fd, *args)


def run(
    repl: Repl, fd: int, *args: str, limit: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = repl.env
    if limit is not None:  # the limit is the process's: coverage could not save its data
        env = {k: v for k, v in env.items() if not k.startswith("COVERAGE_")}
    return subprocess.run(
        repl_argv(*args),
        stdin=subprocess.DEVNULL,
        stdout=fd,
        stderr=subprocess.PIPE,
        env=env,
        timeout=30,
        preexec_fn=limit,
    )


def file_size_limit(size: int) -> Callable[[], None]:
    """``ulimit -f`` in bytes, for the child alone (Python ignores SIGXFSZ: a write past
    the limit fails with EFBIG instead of killing it)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def into_a_file_that_fills_after(
    repl: Repl, tmp_path: Path, first: str, *args: str
) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    """Run with stdout a file that takes ``first`` and one byte more; what it holds."""
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        done = run(repl, fd, *args, limit=file_size_limit(len(first.encode()) + 1))
    finally:
        os.close(fd)
    return done, out.read_bytes()


TOO_LARGE = "repl: cannot write to stdout (File too large)\n"


@pytest.mark.parametrize("kind", KINDS)
def test_a_claimer_that_cannot_write_gives_the_job_back_at_once(
    repl: Repl, s: str, kind: str
) -> None:
    repl.send(s, "job")
    done = run_into(repl, kind, "claim", s, "--timeout", "5")
    assert (done.returncode, done.stderr.decode()) == ENDS[kind]
    assert json.loads(repl.ok("claims", s, "--json")) == []  # nothing held: given back
    first, _header, firing = repl.ok("claim", s, "--json", "--timeout", "5").splitlines()
    got = json.loads(first)
    assert (got["seq"], got["attempt"]) == (1, 2)
    assert json.loads(firing)["result"] == "job"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "reader", [["read"], ["read", "--json"], ["wait"], ["wait", "--full"], ["follow"]]
)
def test_a_reader_that_cannot_write_acknowledges_nothing(
    repl: Repl, s: str, kind: str, reader: list[str]
) -> None:
    repl.send(s, "one", "two")
    verb, *options = reader
    done = run_into(repl, kind, verb, s, *options)
    assert (done.returncode, done.stderr.decode()) == ENDS[kind]
    assert repl.cursor(s, verb) in (None, 0)  # never moved past what it could not write
    # the next reader of that cursor gets both
    assert repl.ok("read", s, "--cursor", verb) == "on-message: one\non-message: two\n"


@pytest.mark.parametrize("verb", ["read", "wait", "follow"])
def test_a_write_that_fails_part_way_acknowledges_only_the_lines_written_before(
    repl: Repl, s: str, verb: str, tmp_path: Path
) -> None:
    repl.send(s, "one", "two")
    first = "on-message: one\n"
    done, written = into_a_file_that_fills_after(repl, tmp_path, first, verb, s)
    assert (done.returncode, done.stderr.decode()) == (1, TOO_LARGE)
    assert written == first.encode() + b"o"  # the second line cut short by the limit
    assert repl.cursor(s, verb) == 1
    assert repl.ok("read", s, "--cursor", verb) == "on-message: two\n"


def test_a_claim_written_part_way_is_given_back(repl: Repl, s: str, tmp_path: Path) -> None:
    repl.send(s, "job")
    token = "work:1:1\n"
    done, written = into_a_file_that_fills_after(repl, tmp_path, token, "claim", s)
    assert (done.returncode, done.stderr.decode()) == (1, TOO_LARGE)
    assert written == token.encode() + b"o"  # its token, but not its firing
    assert json.loads(repl.ok("claims", s, "--json")) == []
    assert repl.ok("claim", s).splitlines() == ["work:1:2", "on-message: job"]
