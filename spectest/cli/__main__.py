"""``python -m spectest.cli``."""

import sys

from spectest.cli import main

sys.exit(main())
