"""`python -m pax_autockpt.tools.report JOB_LOG_DIR`: the module form still works."""

import sys

from pax_autockpt.tools import report

sys.exit(report.main())
