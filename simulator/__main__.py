"""``python -m simulator`` runs the ``tilesim`` command line."""

from simulator.launch import main

raise SystemExit(main())
