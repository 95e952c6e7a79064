"""The commit-message rule (``scripts/commit-msg``): a subject of at most 72 characters,
then a blank line before any body; as git's commit-msg hook, and over a branch's new
commits as ``scripts/check`` runs it, where the old long subjects are left as they are
and a new one fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "commit-msg"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )


def commit(repo: Path, message: str) -> str:
    done = git(repo, "commit", "--allow-empty", "-q", "-m", message)
    assert done.returncode == 0, done.stderr
    return git(repo, "rev-parse", "HEAD").stdout.strip()


def repo_at(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git(repo, "init", "-q", "-b", "main").returncode == 0
    return repo


def test_a_message_is_judged_as_git_keeps_it(tmp_path: Path) -> None:
    message = tmp_path / "COMMIT_EDITMSG"
    cases = {
        "A short subject\n": 0,
        "A short subject\n\nThe body, after a blank line,\nof any length.\n": 0,
        "\n\nA subject after blank lines git drops\n": 0,
        "# a comment line git drops, however long it is" + "." * 80 + "\nShort\n": 0,
        "Short\n" + "# ------------------------ >8 ------------------------\n" + "x" * 99: 0,
        "x" * 72 + "\n": 0,
        "x" * 73 + "\n": 1,
        "A subject\nwith a body right under it\n": 1,
        "": 0,  # git refuses an empty message by itself
    }
    for text, status in cases.items():
        message.write_text(text)
        done = run(str(message))
        assert done.returncode == status, (text, done.stderr)
    message.write_text("x" * 100 + "\nno blank line\n")
    done = run(str(message))
    assert "its subject is 100 characters (at most 72)" in done.stderr
    assert "its subject is not followed by a blank line" in done.stderr


def test_as_the_commit_msg_hook_it_stops_a_long_subject(tmp_path: Path) -> None:
    repo = repo_at(tmp_path)
    hooks = repo / git(repo, "rev-parse", "--git-path", "hooks").stdout.strip()
    hooks.mkdir(parents=True, exist_ok=True)
    (hooks / "commit-msg").symlink_to(SCRIPT)  # README.md's line, in a fresh repository
    commit(repo, "A subject a reader can take in\n\nAnd its body.")
    refused = git(repo, "commit", "--allow-empty", "-q", "-m", "y" * 80)
    assert refused.returncode != 0
    assert "its subject is 80 characters" in refused.stderr
    assert git(repo, "rev-list", "--count", "HEAD").stdout.strip() == "1"


def test_the_new_commits_are_judged_and_the_old_ones_are_left(tmp_path: Path) -> None:
    repo = repo_at(tmp_path)
    commit(repo, "An old subject from before the rule, " + "long " * 40)
    base = commit(repo, "Another old one\nwith its body on the second line")
    assert run("--new", "--base", base, cwd=repo).returncode == 0
    commit(repo, "A new commit that keeps the rule\n\nIts body.")
    done = run("--new", "--base", base, cwd=repo)
    assert done.returncode == 0, done.stderr
    assert "1 new commit(s)" in done.stdout
    subject = "A new commit whose subject runs on" + " and on" * 10
    bad = commit(repo, subject)
    done = run("--new", "--base", base, cwd=repo)
    assert done.returncode == 1
    assert f"commit {bad[:12]}" in done.stderr
    assert f"its subject is {len(subject)} characters" in done.stderr


def test_this_checkout_keeps_the_rule_since_it_began() -> None:
    """What ``scripts/check`` runs: the rule's own start is in this history (a clone of
    main holds it), the 200 commits before it are not judged, and those since are."""
    done = run("--new")
    assert done.returncode == 0, done.stderr


def test_a_directory_that_is_not_a_checkout_has_nothing_to_judge(tmp_path: Path) -> None:
    env_free = tmp_path / "sdist"
    env_free.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--new"],
        cwd=env_free,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "no commits to check" in done.stdout
