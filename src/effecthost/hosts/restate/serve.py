"""``python -m effecthost.hosts.restate.serve --resolver MODULE:CALLABLE``."""

from ._serve import main

if __name__ == "__main__":
    main()
