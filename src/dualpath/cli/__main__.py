"""``python -m dualpath.cli ...``: the same as the ``dualpath`` console script."""

from dualpath.cli import main

main()
