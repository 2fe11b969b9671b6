"""``python -m tfmjax.hf import HF_DIR WORKDIR`` / ``export WORKDIR HF_DIR``."""

import sys

from tfmjax.hf.cli import main

sys.exit(main())
