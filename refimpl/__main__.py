"""``python -m refimpl``: the command line (:mod:`refimpl.cli`)."""

import sys

from .cli import main

sys.exit(main())
