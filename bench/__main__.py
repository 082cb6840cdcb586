"""`python -m bench` (what `make bench` runs): see bench/driver.py."""

import sys

from bench.driver import main

sys.exit(main())
