"""``python -m ember``: the command line (``train``, ``eval``, ``export``, ``predict``, ``generate``)."""

import sys

from ember.cli import main

if __name__ == "__main__":
    sys.exit(main())
