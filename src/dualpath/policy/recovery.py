"""What becomes of a placed request when one of its engines is lost (issue 13's rules).

The runtime scheduler asks :func:`after_engine_loss` for each request the lost engine held and
carries out the answer; the ledger is then told with ``Ledger.on_engine_lost(keep=...)``.
"""

from __future__ import annotations

from typing import Final, Literal

MAX_RETRIES: Final = 1  # a request whose engine was lost before it streamed is re-dispatched this often

Recovery = Literal["keep", "fail_streamed", "fail_retried", "requeue"]


def after_engine_loss(
    *, lost_is_de: bool, streamed: bool, attempts: int, max_retries: int = MAX_RETRIES
) -> Recovery:
    """``keep``: the lost engine was its PE and it already streams from its DE (its state lives
    there); ``fail_streamed``: it was streaming from the lost DE; ``fail_retried``: it streamed
    nothing but was already re-dispatched ``max_retries`` times; ``requeue``: start it again."""
    if streamed:
        return "fail_streamed" if lost_is_de else "keep"
    return "fail_retried" if attempts >= max_retries else "requeue"
