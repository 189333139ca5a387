"""``python -m maka_temporal``: the ``maka`` command."""

import sys

from maka_temporal.workers.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
