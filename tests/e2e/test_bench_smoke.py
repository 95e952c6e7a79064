"""The benchmark runs end to end in its quick mode and prints both its tables.

No timing is asserted (figures belong in the table, not in tests): only that
every row is there, that its numbers parse, and that without redis-server
the reference column and the scale-out rows (all of which need Redis) are
left empty and the install hint is printed. The two runs start side by side
(``runs``), as a run is mostly waiting on its servers and clocks; a group that
needs no Redis is measured in one of them only (``REDIS_FREE``, ``WITHOUT_ONLY``).

A smoke test of the benchmark, not of the product (whose every figure's
behaviour the other tests check), and nearly a minute of two runs: it is
``slow``, run by ``pytest -m slow`` (``.ci/run`` does, after the suite).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a stable fragment of each row's label, in table order
ROWS = (
    "send round trip p50",
    "send round trip p99",
    "wake latency p50 (settle 0), µs",
    "wake latency p99 (settle 0), µs",
    "wake latency p50 (settle 0) against Redis XREAD BLOCK",
    "wake latency p99 (settle 0) against Redis XREAD BLOCK",
    "pipelined sends/s, one client, --memory",
    "pipelined sends/s, one client, durable",
    "pipelined sends/s over 50 sessions",
    "durable, against one session",
    "Redis store (one daemon, one redis-server)",
    "daemon CPU per send of that row",
    "daemon CPU over",
    "idle-timeout period",
    "evaluations over",
    "memory per waiter",
    "fan-out, one send to",
    "fan-out, one send to 50 waiters (settle 0) against Redis XREAD BLOCK",
    "memory per retained firing",
    "`repl read` on an empty session",
    "`repl send` of one firing, whole process",
    "`repl wait` that returns at once with one firing",
    "restart until",
    "RSS after that restart",
    "to each of 4 full rings",
    "memory per retained firing at",
    "(every ring full) until served",
    "RSS after that restart",
    "a read of each of the 4 sessions' newest firing",
    "RSS after those reads",
    "one-shot timer lateness p50",
    "one-shot timer lateness p99",
    "pending timers on",
    "memory per timer",
    "due time to the last firing held by a waiter",
    "due at once on",
    "HTTP send round trip p50 (",
    "HTTP send round trip p50, stock client (http.client",
    "SSE wake latency p50",
    "HTTP long-poll wake latency p50",
    "SSE fan-out, one send to",
    "memory per open event stream",
    "TLS send round trip p50",
    "TLS send round trip p99",
    "TLS pipelined sends/s",
    "TLS connection set-up p50",
    "`repl send` over TLS, whole process",
    # the groups measured only in the run without redis-server (WITHOUT_ONLY)
    "send with 4 tags, round trip p50, durable",
    "send with 4 tags, round trip p50, --memory",
    "send with 4 tags, pipelined sends/s, durable",
    "send with 4 tags, pipelined sends/s, --memory",
    "memory per retained firing with 4 tags",
    "matching wait's wake latency p50, after 100 firings that do not match",
    "matching wait's wake latency p99, after 100 firings that do not match",
    "MCP wait's wake latency p50",
    "MCP wait's wake latency p99",
    "MCP send round trip p50",
    "MCP send round trip p99",
    "MCP push latency p50, `--ack agent`",
    "MCP push latency p99, `--ack agent`",
    "MCP push latency p50, `--ack pipe`",
    "MCP push latency p99, `--ack pipe`",
    "MCP `send` tool round trip p50",
    "MCP `send` tool round trip p99",
    "TCP send round trip p50 beside those tool calls",
    "TCP send round trip p99 beside those tool calls",
    "idle `repl mcp --follow` servers and the daemon: CPU over",
    "idle `repl mcp --follow` servers: the daemon's evaluations over",
    # the claims group, measured in both runs (its reference is Redis's consumer groups)
    "claim then done, jobs/s, 4 workers, 400 jobs, --memory",
    "claim then done, jobs/s, 4 workers, 125 jobs, durable",
    "done --next, jobs/s, 4 workers, 125 jobs, durable",
    "blocked claim's wake latency p50",
    "idle claims on one session: daemon CPU over",
    "idle claims on one session: evaluations over",
    # the join group, measured only in the run without redis-server (WITHOUT_ONLY)
    "wait `all` over 3 sessions, woken by the last's firing (settle 0), wake latency p50",
    "wait `all` over 3 sessions, woken by the last's firing (settle 0), wake latency p99",
    "gather of 10 corr ids, woken by the last reply (settle 0), wake latency p50",
    "gather of 10 corr ids, woken by the last reply (settle 0), wake latency p99",
    "blocked gathers and 10 blocked joins: daemon CPU over",
    "blocked gathers and 10 blocked joins: evaluations over",
    "200 jobs claimed then done by one worker, one join blocked on them: daemon CPU per job",
    "200 jobs claimed then done by one worker, one join blocked on them: evaluations per job",
    # the approve group, measured only in the run with redis-server (it never looks for one)
    "verdict latency p50 (`repl approve` started to the permission notification read",
    "verdict latency p90 (`repl approve` started to the permission notification read",
    # the settle group, measured only in the run with redis-server (it never looks for one)
    "a lone firing's wake, default settle ÷ settle 0: `repl wait` woken by `repl send`",
    "a lone firing's wake, default settle ÷ settle 0: `wait` over the line protocol",
    "a lone firing's wake, default settle ÷ settle 0: HTTP long poll",
    "a lone firing's wake, default settle ÷ settle 0: MCP `wait` tool",
    "a lone firing's wake, default settle ÷ settle 0: MCP `request` tool",
)
# the tls group's notes: each figure over TLS and plain, repl then its anchors (bench/tls.py)
TLS_NOTES = (
    "note: TLS send round trip p50 / p99, µs: repl ",
    "note: TLS pipelined sends/s: repl ",
    "note: TLS connection set-up p50 / p99, µs: repl ",
)
COLUMNS = ["figure", "repl", "reference", "ratio", "goal", "met?", "floor"]

# the scale-out tables: several daemons on one Redis, then on a Redis Cluster (bench/scaleout.py)
SCALE_ROWS = (
    "pipelined sends/s, 1 daemon, 6 clients",
    "daemon CPU per send, µs, 1 daemon",
    "redis-server CPU per send, µs, 1 daemon",
    "Redis commands per send",
    "Redis commands per read",
    "Redis commands per wait cycle",
    "wake p50, µs, 1 daemon",
    "wake p99, µs, 1 daemon",
    "cross-daemon wake p50",
    "cross-daemon wake p99",
    "pipelined sends/s, 3 daemons, one contended session",
    "sends refused (answered not ok), 3 daemons",
    "retries (scripts run beyond sends answered), 3 daemons",
    "daemons' CPU per send, µs, 3 daemons, one session",
    "pipelined sends/s, 2 daemons, a session each",
    "pipelined sends/s, 3 daemons, a session each",
    "daemons' CPU per send, µs, 2 daemons, a session each",
    "daemons' CPU per send, µs, 3 daemons, a session each",
    "sends refused in the other loads",
)
#: the groups that never start a redis-server or look for one (bench/cli.py, bench/http_api.py,
#: bench/matching.py, bench/mcp_agent.py, bench/mcp_follow.py, bench/join.py,
#: bench/approvals.py, bench/settle.py): each is measured in one of the two runs only
REDIS_FREE = ("cli", "http", "tags", "mcp", "push", "join", "approve", "settle")
#: of those, the ones measured in the run without redis-server (the shorter run: it starts no
#: redis-server), the others in the run with it, so that neither run is much the longer
WITHOUT_ONLY = ("tags", "mcp", "push", "join")

pytestmark = pytest.mark.slow
SCALE_COLUMNS = COLUMNS[:-1]  # the main table's, but the floor
SCALE_TITLES = ("scale-out on one Redis", "scale-out on a 3-primary Redis Cluster")


def parse_table(lines: list[str], columns: list[str]) -> list[dict[str, str]]:
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == columns
    rows = []
    for line in lines[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


class Quick:
    """One ``python -m bench --quick`` run, started at once (its output into files);
    ``result`` waits for it and gives the output, the main table's rows and each scale-out
    table's rows."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.out, self.err = workdir / "stdout", workdir / "stderr"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench", "--quick", *extra],
                cwd=ROOT,
                stdout=out,
                stderr=err,
            )

    def result(self) -> tuple[str, list[dict[str, str]], list[list[dict[str, str]]]]:
        self.proc.wait(150)  # a loaded machine (a test suite beside it) has taken 100 s
        stdout = self.out.read_text()
        assert self.proc.returncode == 0, stdout + self.err.read_text()
        tables: list[list[str]] = []
        previous = ""
        for line in stdout.splitlines():
            if line.startswith("|"):
                if not previous.startswith("|"):
                    tables.append([])
                tables[-1].append(line)
            previous = line
        assert len(tables) == 1 + len(SCALE_TITLES), stdout
        for title in SCALE_TITLES:
            assert title in stdout, stdout
        scale = [parse_table(table, SCALE_COLUMNS) for table in tables[1:]]
        return stdout, parse_table(tables[0], COLUMNS), scale

    def stop(self) -> None:
        if self.proc.poll() is None:  # a test that failed before it waited
            self.proc.kill()
            self.proc.wait(10)


#: the module's tests, each with its run: with redis-server, and without one
WITH = "test_quick_benchmark_prints_every_row_with_numbers"
WITHOUT = "test_without_redis_server_the_reference_column_is_empty_and_the_hint_printed"


def measured(test: str, group: str) -> bool:
    """Whether the run of ``test`` measures ``group``: without redis-server, the groups that
    look for it and those of ``WITHOUT_ONLY``; with it, all but ``WITHOUT_ONLY``."""
    if test == WITHOUT:
        return group not in REDIS_FREE or group in WITHOUT_ONLY
    return group not in WITHOUT_ONLY


def arguments(test: str) -> tuple[str, ...]:
    """The run of ``test``."""
    from bench.run import ALL_GROUPS

    groups = ",".join(group for group in ALL_GROUPS if measured(test, group))
    if test == WITH:
        return ("--only", groups)
    return ("--redis-server", "/nonexistent/redis-server", "--only", groups)


def fragments(test: str) -> tuple[str, ...]:
    """The rows of ``ROWS`` that the run of ``test`` prints (ROWS in table order is every
    group's rows in the groups' order: the two tests together check it)."""
    from bench.figures import GROUPS
    from bench.measure import QUICK

    of = [name for name, group in GROUPS.items() for _ in group.rows(QUICK)]
    return tuple(f for f, g in zip(ROWS, of, strict=True) if measured(test, g))


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Quick]]:
    """The runs of the module's selected tests, started side by side: each mostly waits on
    its servers and clocks, so together they take little longer than the longer alone."""
    selected = [
        item.name
        for item in request.session.items
        if getattr(item, "module", None) is request.module and item.name in (WITH, WITHOUT)
    ]
    started = {test: Quick(tmp_path_factory.mktemp("bench"), *arguments(test)) for test in selected}
    yield started
    for run in started.values():
        run.stop()


def parse_number(cell: str) -> float:
    return float(cell.replace(",", ""))


def check_rows(rows: list[dict[str, str]], fragments: tuple[str, ...] = ROWS) -> None:
    assert len(rows) == len(fragments)
    for fragment, row in zip(fragments, rows, strict=True):
        assert fragment in row["figure"], (fragment, row)
        if row["repl"].startswith("n/a"):
            # only Redis's absence may leave repl unmeasured (a row with no figure but
            # through Redis): a piece of the bench extra missing makes the run exit 1
            assert row["repl"] == "n/a (redis-server missing)", row
        else:
            parse_number(row["repl"])
        for column in ("reference", "ratio", "floor"):
            if row[column]:
                parse_number(row[column])
        assert row["met?"] in ("yes", "no", "n/a"), row


def check_tls_notes(out: str, *, redis: bool) -> None:
    """The TLS figures' notes: repl and the floor, and Redis (over its TLS port) with it."""
    redis = redis and "TLS: no Redis figures" not in out  # a redis-server built without TLS
    lines = out.splitlines()
    for start in TLS_NOTES:
        found = [line for line in lines if line.startswith(start)]
        assert len(found) == 1, (start, out)
        assert "floor" in found[0], found
        assert ("Redis" in found[0]) == redis, found


def check_scale_rows(rows: list[dict[str, str]], *, redis: bool) -> None:
    assert len(rows) == len(SCALE_ROWS)
    for fragment, row in zip(SCALE_ROWS, rows, strict=True):
        assert fragment in row["figure"], (fragment, row)
        assert row["met?"] in ("yes", "no", "n/a"), row
        if redis:
            parse_number(row["repl"])
            for column in ("reference", "ratio"):
                if row[column]:
                    parse_number(row[column])
        else:
            assert row["repl"] == "n/a (no redis-server)", row
            assert (row["reference"], row["ratio"], row["met?"]) == ("", "", "n/a"), row


@pytest.mark.timeout(200)
def test_quick_benchmark_prints_every_row_with_numbers(runs: dict[str, Quick]) -> None:
    out, rows, scale = runs[WITH].result()
    check_rows(rows, fragments(WITH))
    check_tls_notes(out, redis=True)
    for note in ("note: claims: ", "note: claim wake: ", "note: idle claims: "):
        assert note in out, out
    assert "Redis " in next(line for line in out.splitlines() if line.startswith("note: claims: "))
    assert "note: approve: " in out, out
    for table in scale:
        check_scale_rows(table, redis=True)


@pytest.mark.timeout(200)
def test_without_redis_server_the_reference_column_is_empty_and_the_hint_printed(
    runs: dict[str, Quick],
) -> None:
    """Every group that looks for redis-server, with none to find, and the groups of
    ``WITHOUT_ONLY``. The groups that never look (``REDIS_FREE``) measure the same with or
    without it, so each is measured in one run only: cli, http and approve in the test
    above, tags, mcp, push and join here."""
    from bench.figures import GROUPS

    for group in REDIS_FREE:  # what makes measuring them once safe: their module never looks
        assert "redis" not in Path(inspect.getfile(GROUPS[group].run)).read_text().lower()
    out, rows, scale = runs[WITHOUT].result()
    check_rows(rows, fragments(WITHOUT))
    for note in (
        "note: tagged send round trip p50 / p99",
        "note: matching wait: ",
        "note: claims: ",
        "note: claim wake: ",
        "note: join wakes: ",
        "note: join idle: ",
        "note: join cost: ",
    ):
        assert note in out, out
    assert "note: MCP: " in out, out
    assert "note: push: " in out, out
    check_tls_notes(out, redis=False)
    for table in scale:
        check_scale_rows(table, redis=False)
    assert "apt-get install redis-server" in out
    for row in rows:
        if "Redis" in row["goal"]:
            assert row["reference"] == "", row
            assert row["ratio"] == "", row
            assert row["met?"] == "n/a", row
