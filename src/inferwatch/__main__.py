"""`python -m inferwatch` runs the CLI."""

import sys

from inferwatch.cli import main

sys.exit(main())
