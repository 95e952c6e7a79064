"""What the test modules share: daemons to talk to, a raw client, and ``repl`` as a user runs it.

A test daemon listens on a loopback port the OS chose, in a fresh home, and
comes in two kinds with one face (``port``, ``home``, ``token``, ``addr``,
``client()``, ``env()``):

- ``InProcDaemon`` runs ``serve_daemon`` on an event loop thread of the test
  process (an anyio blocking portal): no subprocess, so it starts in a few
  milliseconds. Most tests over the wire use it. ``running_daemon`` is the
  same for async tests, in the test's own task group. Handed a
  ``MovedClock``, its timers are due by a clock that stands still until the
  test moves it, so a timer test moves the clock and checks exactly what
  fired, whatever the load on the machine.
- ``DaemonProc`` runs ``python -m repl_daemon`` as a child process, for the
  tests that need a real one: SIGTERM and its exit status, SIGKILL,
  restarts on the same home, its stderr and its log.

``Client`` speaks the wire protocol over a plain blocking socket, so tests
see exactly the bytes a user's program would. It is used from test threads
only, never from inside an in-process daemon's event loop. ``Repl`` runs
the installed ``repl`` against a test daemon, with REPL_ADDR and REPL_HOME
in its environment. ``RedisProc`` is a redis-server of the test's own,
``RedisClusterProcs`` a Redis Cluster of them on loopback, and
``SharedDaemons`` daemon processes that share one ``--store`` URL.

No tests and no fixtures live here: the fixtures are declared once, in
``tests/conftest.py`` or in the conftest of the one folder that uses them.
"""

from tests.helpers.cli import (
    RUN_TIMEOUT,
    SCRIPT,
    Repl,
    assert_one_error_line,
    repl_argv,
    repl_shell,
)
from tests.helpers.client import Client, answered, pipelined
from tests.helpers.common import each_at_once, eventually, examples, free_port, read_line, unread
from tests.helpers.daemons import (
    DAEMON_STORES,
    Daemon,
    DaemonProc,
    InProcDaemon,
    LoggedElsewhere,
    MovedClock,
    SharedDaemons,
    WatchedClock,
    daemon_config,
    inproc_daemon,
    running_daemon,
    small_disk,
)
from tests.helpers.redis import REDIS_KINDS, RedisClusterProcs, RedisProc, store_url
from tests.helpers.requires import require_build, require_chromium, require_redis, require_tool
from tests.helpers.stores import TS, Mirror, counted

__all__ = [
    "DAEMON_STORES",
    "REDIS_KINDS",
    "RUN_TIMEOUT",
    "SCRIPT",
    "TS",
    "Client",
    "Daemon",
    "DaemonProc",
    "InProcDaemon",
    "LoggedElsewhere",
    "Mirror",
    "MovedClock",
    "RedisClusterProcs",
    "RedisProc",
    "Repl",
    "SharedDaemons",
    "WatchedClock",
    "answered",
    "assert_one_error_line",
    "counted",
    "daemon_config",
    "each_at_once",
    "eventually",
    "examples",
    "free_port",
    "inproc_daemon",
    "pipelined",
    "read_line",
    "repl_argv",
    "repl_shell",
    "require_build",
    "require_chromium",
    "require_redis",
    "require_tool",
    "running_daemon",
    "small_disk",
    "store_url",
    "unread",
]
