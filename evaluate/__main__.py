"""`python -m evaluate RUN_DIR` (what `make eval` runs): see evaluate/evaluate.py."""

import sys

from evaluate.evaluate import main

sys.exit(main())
