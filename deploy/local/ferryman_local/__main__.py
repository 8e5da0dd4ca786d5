"""``python -m ferryman_local``."""

from ferryman_local.cli import main

raise SystemExit(main())
