"""What becomes of a placed request when one of its engines is lost, and where it resumes.

The runtime scheduler asks :func:`after_engine_loss` for each request the lost engine held and
carries out the answer; a request that resumes is put back at the head of the global queue as
:func:`resumed_request` says (the ledger's ``on_finished(rid, requeue=True, info=...)``), and the
ledger is then told with ``Ledger.on_engine_lost(keep=...)``. Which engines take the resumed
request is the policy's ordinary placement of a request at the head of the queue (the lost engine
is out of the views); which of its KV is read, and by which read path, is the ordinary hit rule
and read-side choice over its extended prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from dualpath.core.errors import require
from dualpath.policy.views import RequestInfo

if TYPE_CHECKING:
    from dualpath.policy.ledger import Ledger

# A request lost to engine deaths resumes this often; lost once more, it fails (a request that
# keeps taking its engines down must not loop through the cluster).
MAX_RETRIES: Final = 1

Recovery = Literal["keep", "resume", "fail"]


def after_engine_loss(
    *, lost_is_de: bool, decoding: bool, attempts: int, max_retries: int = MAX_RETRIES
) -> Recovery:
    """``keep``: the lost engine was its PE and its DE decodes it already (the DE sent a token,
    so the prompt KV and the first token are there); ``resume``: start it again from the tokens its
    client has (none, or those it streamed); ``fail``: it resumed ``max_retries`` times already."""
    if decoding and not lost_is_de:
        return "keep"
    return "fail" if attempts >= max_retries else "resume"


def resumed_request(
    request_id: str, *, prompt_len: int, max_tokens: int, generated: int, hit_len: int
) -> RequestInfo:
    """The request that goes on after ``generated`` tokens its client has: its prompt is the
    original ``prompt_len`` tokens plus those, of which the first ``hit_len`` (the whole blocks
    persisted in the store during decode, at least one token left to compute) are read from the
    store and the tail recomputed; ``max_tokens - generated`` tokens remain to generate."""
    require(0 <= generated < max_tokens, "generated", generated, f"must be in [0, {max_tokens})")
    total = prompt_len + generated
    require(0 <= hit_len < total, "hit_len", hit_len, f"must be in [0, {total})")
    return RequestInfo(
        request_id=request_id, cached_len=hit_len, new_len=total - hit_len, gen_len=max_tokens - generated
    )


def lose_engine(ledger: Ledger, engine_id: int, attempts: dict[str, int]) -> list[str]:
    """The rule above on a ledger whose requests never stream (a conformance trace's
    ``engine_lost`` in the reference and sim trace drivers; the runtime scheduler applies it in
    ``engine_died``, which also tells the engines and clients): each request the engine holds, in
    ``requests_on`` order, resumes from the start (``attempts`` counts it) or, when
    ``after_engine_loss`` says so (lost again after a retry), fails and leaves the ledger; then
    the engine leaves. Mutates both; returns the ids that failed."""
    failed = []
    for rid in ledger.requests_on(engine_id):
        entry = ledger.requests[rid]
        what = after_engine_loss(
            lost_is_de=entry.de == engine_id, decoding=False, attempts=attempts.get(rid, 0)
        )
        if what == "resume":
            attempts[rid] = attempts.get(rid, 0) + 1
            ledger.on_finished(rid, requeue=True)
        else:
            failed.append(rid)
            ledger.on_finished(rid)
    ledger.on_engine_lost(engine_id)
    return failed
