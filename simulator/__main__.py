"""``python -m simulator`` runs the ``tilesim`` command line."""

from simulator.cli import main

raise SystemExit(main())
