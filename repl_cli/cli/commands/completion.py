"""``repl completion``: the shell code that completes repl's commands and the daemon's names.

The completions themselves: click's, for the commands and their options
(each command's module loaded as the shell asks), and ``repl_cli.cli.complete``
for what the daemon holds.
"""

from __future__ import annotations

import click

from repl_cli.cli import output
from repl_cli.cli.command import command

#: the environment variable click's completion scripts set to ask ``repl`` for completions
COMPLETE_VAR = "_REPL_COMPLETE"


@command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell code that completes repl's commands and options, and the daemon's
    session ids, cursors, timers and token names.

    \b
    bash:  eval "$(repl completion bash)"     in ~/.bashrc (bash 4.4 or newer)
    zsh:   eval "$(repl completion zsh)"      in ~/.zshrc
    fish:  repl completion fish > ~/.config/fish/completions/repl.fish
    """
    from click.shell_completion import get_completion_class

    shell_class = get_completion_class(shell)
    assert shell_class is not None  # click has all three
    output.line(shell_class(ctx.find_root().command, {}, "repl", COMPLETE_VAR).source())
