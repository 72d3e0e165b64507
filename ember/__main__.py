"""``python -m ember``: the command line (``train``, ``eval``, ``export``, ``predict``, ``generate``)."""

from ember.cli import run

if __name__ == "__main__":
    run()
