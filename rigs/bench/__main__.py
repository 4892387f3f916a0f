"""`python -m rigs.bench` (what `make bench` runs)."""

import sys

from rigs.bench import main

sys.exit(main())
