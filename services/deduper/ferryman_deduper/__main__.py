"""``python -m ferryman_deduper``."""

from ferryman_deduper.cli import main

raise SystemExit(main())
