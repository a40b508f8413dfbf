"""``python -m dualpath.cli``: the same as the ``dualpath`` command."""

from __future__ import annotations

from dualpath.cli import main

main()
