"""``python -m repl_cli``: the same as the ``repl`` command."""

import sys

from repl_cli.cli.entry import main

sys.exit(main())
