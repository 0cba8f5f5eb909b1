"""``python -m symmcoll ...`` is the ``symmcoll`` command."""

import sys

from .cli import main

sys.exit(main())
