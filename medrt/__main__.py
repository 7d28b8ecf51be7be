"""``python -m medrt`` is the same as the ``medrt`` console script."""

import sys

from medrt.cli import main

sys.exit(main())
