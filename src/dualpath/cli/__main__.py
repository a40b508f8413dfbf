"""``python -m dualpath.cli ...``: the same as the ``dualpath`` console script."""

from __future__ import annotations

from dualpath.cli import main

main()
