"""``python -m plelab`` (and ``torchrun -m plelab``) runs the CLI."""

import sys

from plelab.cli import main

sys.exit(main())
