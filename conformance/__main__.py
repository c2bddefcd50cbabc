"""``python -m conformance``: the same as the ``jfa-conformance`` command."""
import sys

from .cli import main

sys.exit(main())
