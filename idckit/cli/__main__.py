"""``python -m idckit.cli``: the ``idckit`` command, as the Makefile and torchrun start it."""
import sys

from idckit.cli import main

sys.exit(main())
