"""``python -m freshidx.cli ...`` = ``freshidx ...``."""

import sys

from freshidx.cli import main

sys.exit(main())
