"""``repl daemon --store URL`` that cannot work ends the start with one line, never a traceback.

The daemon's log lines (``INFO ...``) may come first; the last line on
stderr is the one that says what is wrong, and a password in the URL never
appears anywhere in what the daemon prints.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import repl_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://u:hunter2@127.0.0.1:{dead}/0", "cannot reach Redis at redis://u:***@127.0.0.1:"),
        (
            "redis+cluster://u:hunter2@127.0.0.1:{dead},127.0.0.1:{dead}",
            "cannot reach Redis at redis+cluster://u:***@",
        ),
        ("redis://u:hunter2@127.0.0.1:1/0?colour=blue", "options repl does not know: colour"),
        ("redis://127.0.0.1:1/zero", "database 'zero' in the store URL is not a number"),
        ("redis+cluster://127.0.0.1:1/3", "database 0 only"),
        ("redis://127.0.0.1:1/0?replicas=many", "?replicas=many in the store URL is not a number"),
        ("redis://127.0.0.1/0", "is not HOST:PORT"),
        ("mysql://127.0.0.1:1", "--store takes redis://"),
    ],
)
def test_a_store_url_that_cannot_work_ends_the_start_with_one_line(
    tmp_path: Path, url: str, says: str
) -> None:
    dead = free_port()  # nothing listens there
    done = subprocess.run(
        repl_argv(
            "--addr",
            f"127.0.0.1:{free_port()}",
            "--home",
            str(tmp_path / "home"),
            "daemon",
            "--store",
            url.format(dead=dead),
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1, done
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("repl daemon: ") and says in lines[0], lines[0]
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr + done.stdout


def test_without_the_redis_extra_the_start_says_which_pip_install_brings_it(
    tmp_path: Path,
) -> None:
    # ``sys.modules["redis"] = None`` makes ``import redis`` fail as where it is not installed
    probe = (
        "import sys\n"
        "sys.modules['redis'] = None\n"
        "from repl_cli.cli.main import main\n"
        f"sys.exit(main(['--addr', '127.0.0.1:{free_port()}', '--home', {str(tmp_path)!r},\n"
        "                'daemon', '--store', 'redis://127.0.0.1:6379/0']))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert lines == [
        "repl daemon: --store redis:// needs the redis client: pip install 'repl-inbox[redis]'"
    ]
