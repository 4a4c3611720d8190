"""``python -m effecthost.cli``."""

from effecthost.cli import main

raise SystemExit(main())
