"""Run the ``cronjob`` command line as ``python -m cronjob``."""

from __future__ import annotations

import sys

from .admin._cli import main

if __name__ == "__main__":
    sys.exit(main())
