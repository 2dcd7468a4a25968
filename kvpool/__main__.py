"""``python -m kvpool`` is the ``kvpool`` command."""

from kvpool.cli import main

raise SystemExit(main())
