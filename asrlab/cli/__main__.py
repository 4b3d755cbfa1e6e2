"""``python -m asrlab.cli``: what the ``asrlab`` command runs (torchrun starts the ranks this way)."""

import sys

from . import main

sys.exit(main())
