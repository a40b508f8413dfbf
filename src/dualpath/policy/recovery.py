"""What becomes of a placed request when one of its engines is lost (issue 13's rules).

The runtime scheduler asks :func:`after_engine_loss` for each request the lost engine held and
carries out the answer; the ledger is then told with ``Ledger.on_engine_lost(keep=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from dualpath.policy.ledger import Ledger

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


def lose_engine(ledger: Ledger, engine_id: int, attempts: dict[str, int]) -> list[str]:
    """The rule above on a ledger whose requests never stream (a conformance trace's
    ``engine_lost`` in the reference and sim trace drivers; the runtime scheduler applies it in
    ``engine_died``, which also tells the engines and clients): each request the engine holds, in
    ``requests_on`` order, is requeued (``attempts`` counts it) or, when ``policy.recovery`` says
    so (lost again after a retry), fails and leaves the ledger; then the engine leaves. Mutates
    both; returns the ids that failed."""
    failed = []
    for rid in ledger.requests_on(engine_id):
        entry = ledger.requests[rid]
        what = after_engine_loss(
            lost_is_de=entry.de == engine_id, streamed=False, attempts=attempts.get(rid, 0)
        )
        if what == "requeue":
            attempts[rid] = attempts.get(rid, 0) + 1
            ledger.on_finished(rid, requeue=True)
        else:
            failed.append(rid)
            ledger.on_finished(rid)
    ledger.on_engine_lost(engine_id)
    return failed
