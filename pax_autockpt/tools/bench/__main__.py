"""`python -m pax_autockpt.tools.bench` (what `make bench` runs)."""

import sys

from pax_autockpt.tools.bench import main

sys.exit(main())
