"""``python -m ferryman_wrapper``."""

from ferryman_wrapper.cli import main

raise SystemExit(main())
