"""``python3 -m ptsolve.serve table|precompile`` (``build.main``)."""
import sys

from .build import main

sys.exit(main())
