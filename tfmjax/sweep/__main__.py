"""``python -m tfmjax.sweep``: see :mod:`tfmjax.sweep.cli`."""

import sys

from tfmjax.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
