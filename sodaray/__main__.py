"""`python -m sodaray`: the same command line as `sodaray`."""

import sys

from sodaray.cli import main

sys.exit(main())
