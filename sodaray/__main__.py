"""`python -m sodaray`: the same command line as `sodaray`."""

from sodaray.cli import main

raise SystemExit(main())
