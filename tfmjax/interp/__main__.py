"""``python -m tfmjax.interp WORKDIR COMMAND``: see :mod:`tfmjax.interp.cli`."""

import sys

from tfmjax.interp.cli import main

sys.exit(main())
