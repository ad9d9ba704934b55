"""``python -m pidlease.cli``: the ``pidlease`` command."""

from pidlease.cli.commands import main

raise SystemExit(main())
