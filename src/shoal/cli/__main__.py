"""``python -m shoal.cli``, as ``python -m shoal``."""

import sys

from shoal.cli import main

sys.exit(main())
