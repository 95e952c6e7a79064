"""The judges and the test libraries are pinned, exactly, in one file that both installs use.

A green CI once turned red with nothing in the repository changed: mypy
and redis-py had released, and every judge was a range. ``constraints.txt``
(made by ``scripts/pin``) holds the exact version of every package the
project's extras bring; README.md's test command and ``.ci/run`` both
install with ``-c constraints.txt``. These tests keep that true: both
commands name the file, every dependency of ``pyproject.toml`` is pinned
there within its range, and the environment running this suite has the
pinned version of each judge (so a suite run on other versions says so).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "constraints.txt"

#: the tools that judge the code, and the test libraries they run
JUDGES = ("ruff", "mypy", "pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "coverage")


def pins() -> dict[str, Version]:
    """``constraints.txt``'s ``NAME==VERSION`` lines, markers aside, by canonical name."""
    found: dict[str, Version] = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt pins {line!r} without =="
        found[canonicalize_name(name)] = Version(version)
    return found


def declared() -> list[Requirement]:
    """Every dependency and extra's requirement, but an extra's reference to the project's
    own extras (the bench extra brings ``repl-inbox[http,mcp,...]``): the project is not
    pinned, and what those extras bring is in the list in its own right."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    requirements = [Requirement(line) for line in lines]
    own = canonicalize_name(project["name"])
    return [r for r in requirements if canonicalize_name(r.name) != own]


def test_an_extra_that_brings_the_projects_own_extras_names_ones_that_exist() -> None:
    """``repl-inbox[http,mcp]`` in an extra: the name is the project's, each extra is one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    own = canonicalize_name(project["name"])
    for lines in extras.values():
        for line in lines:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == own:
                assert requirement.extras <= set(extras), line
                assert not requirement.specifier, f"{line}: the project itself, any version"


def test_the_test_command_and_ci_install_from_the_pins() -> None:
    readme = ROOT.joinpath("README.md").read_text()
    section = readme[readme.index("## Install and run the tests") :]
    command = re.search(r"```sh\n(.*?)```", section, re.S)
    assert command is not None
    assert "pip install -c constraints.txt -e '.[test]'" in command.group(1)
    ci = ROOT.joinpath(".ci", "run").read_text()
    installs = [line for line in ci.splitlines() if re.search(r"pip install .*-e", line)]
    assert installs, ".ci/run installs nothing editable"
    for line in installs:
        assert "-c constraints.txt" in line, line
    # the venv's own pip: an unpinned upgrade of the installer is a new judge too
    assert "--upgrade pip" not in ci


def test_every_dependency_is_pinned_exactly_within_its_range() -> None:
    pinned = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not pinned: run scripts/pin"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{requirement} does not admit the pinned {pinned[name]}: run scripts/pin"
        )


def test_the_ranges_a_user_installs_stay_ranges() -> None:
    for requirement in declared():
        assert not any(spec.operator == "==" for spec in requirement.specifier), (
            f"{requirement}: pyproject.toml keeps ranges; constraints.txt holds the pins"
        )


def test_this_suite_runs_on_the_pinned_judges() -> None:
    pinned = pins()
    for judge in JUDGES:
        installed = Version(metadata.version(judge))
        assert installed == pinned[canonicalize_name(judge)], (
            f"{judge} {installed} is installed, constraints.txt pins {pinned[judge]}: "
            "pip install -c constraints.txt -e '.[test]'"
        )
