"""The wheel a user installs holds the whole product: every module, every data file, ``repl``.

The other tests run the project installed editable, where the source tree
stands in for the wheel, so a wheel that leaves something out passes them
all: a package list that left ``repl_daemon.engine`` and ``.stores`` out
gave an installed daemon that died at start. This builds the wheel the way
pip does (PEP 517 through the project's own build backend) from a copy of
the tree, so that a ``build/`` left in the checkout cannot fill a gap, and
compares its files with the three packages' files on disk. Built without
isolation (the ``test`` extra brings ``build`` and setuptools), it takes
a few seconds; ``scripts/wheel-smoke`` installs a wheel and runs it.
"""

from __future__ import annotations

import configparser
import email.parser
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from repl_daemon.protocol import VERSION
from tests.helpers import require_build

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("session", "repl_daemon", "repl_cli")

#: what a checkout may hold beside its sources, and a build must not see
NOT_SOURCES = shutil.ignore_patterns(
    ".*", "__pycache__", "*.pyc", "build", "dist", "*.egg-info", "node_modules"
)


def package_files() -> set[str]:
    """Every file of the three packages in the source tree, as the wheel names them:
    the modules, ``py.typed`` and the page's files (bytecode caches aside)."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(path.relative_to(ROOT).as_posix())
    return found


def build_wheel(out: Path) -> zipfile.ZipFile:
    tree = out / "tree"
    shutil.copytree(ROOT, tree, ignore=NOT_SOURCES)
    # the build is not the product's code: coverage's subprocess patch stays out of it
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation"]
    done = subprocess.run(
        [*command, "--outdir", str(out / "dist"), str(tree)],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, f"the wheel did not build:\n{done.stdout}\n{done.stderr}"
    (wheel,) = (out / "dist").glob("*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_every_module_and_data_file_and_the_repl_command(
    tmp_path: Path,
) -> None:
    require_build()
    with build_wheel(tmp_path) as wheel:
        names = set(wheel.namelist())
        (info,) = {name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA")}
        entry_points = configparser.ConfigParser()
        entry_points.read_string(wheel.read(f"{info}/entry_points.txt").decode())
        metadata = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())

    missing = sorted(package_files() - names)
    assert not missing, "files of the packages that the wheel leaves out:\n" + "\n".join(missing)

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"repl": "repl_cli.cli.entry:main"}
    assert dict(entry_points["console_scripts"]) == scripts
    assert "repl_cli/cli/main.py" in names
    # the version is kept in the protocol module, and the wheel says the same
    assert metadata["Version"] == VERSION
