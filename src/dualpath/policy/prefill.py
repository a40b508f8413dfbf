"""PE selection and read-path choice for a PE fetch (spec section 8).

Pure: works on private copies of the view's numbers and returns a frozen PrefillPlan.

Tie-breaks (documented in docs/policy.md): lower class (C2 before C3), then smaller ``tok_e``, then
earlier position (group order in the view, then rank order). Read side ties go to the PE side.
"""

from __future__ import annotations

from dualpath.core.errors import DualpathError
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.views import (
    NodeReadQueue,
    PrefillAssignment,
    PrefillFetchView,
    PrefillPlan,
    ReadSide,
)

PE_CHOICES: tuple[str, ...] = ("least-loaded", "round-robin")
READ_CHOICES: tuple[str, ...] = ("pe", "de", "shorter", "split")


class _Reads:
    """Mutable per-fetch copy of the read queues: node id -> [tokens, tokens/s]."""

    __slots__ = ("order", "table")

    def __init__(self, queues: tuple[NodeReadQueue, ...]) -> None:
        self.order = [q.node_id for q in queues]
        self.table: dict[int, list[float]] = {}
        for q in queues:
            if q.node_id in self.table:
                raise DualpathError(f"read_queues: node_id={q.node_id!r} appears twice")
            self.table[q.node_id] = [q.read_queue_tokens, q.read_tokens_per_s]

    def get(self, node_id: int) -> list[float]:
        try:
            return self.table[node_id]
        except KeyError:
            raise DualpathError(f"read_queues has no entry for node_id={node_id!r}") from None

    def freeze(self) -> tuple[NodeReadQueue, ...]:
        return tuple(
            NodeReadQueue(node_id=n, read_queue_tokens=int(self.table[n][0]),
                          read_tokens_per_s=self.table[n][1])
            for n in self.order
        )


def split_read(
    cached_len: int, pe_queue: list[float], de_queue: list[float], block_size: int
) -> tuple[int, int]:
    """Split ``cached_len`` hit tokens so both sides are expected to finish together.

    Solves ``(q_pe + x) / b_pe = (q_de + cached - x) / b_de`` for x (PE tokens), clamps to
    [0, cached] and rounds to whole blocks (half up). PE reads the prefix. Returns (pe, de).
    """
    q_pe, b_pe = pe_queue
    q_de, b_de = de_queue
    if b_pe <= 0 or b_de <= 0:
        raise DualpathError(f"split reads need read_tokens_per_s > 0, got {b_pe!r} and {b_de!r}")
    x = (b_pe * (q_de + cached_len) - b_de * q_pe) / (b_pe + b_de)
    x = min(max(x, 0.0), float(cached_len))
    pe_len = min(int(x / block_size + 0.5) * block_size, cached_len)
    return pe_len, cached_len - pe_len


def choose_read(
    choice: str, cached_len: int, pe_queue: list[float], de_queue: list[float], block_size: int
) -> tuple[ReadSide, int, int]:
    """Return ``(side, pe_read_len, de_read_len)`` and add the reads to the queues (in place)."""
    if choice == "pe":
        pe_len = cached_len
    elif choice == "de":
        pe_len = 0
    elif choice == "shorter":
        pe_len = cached_len if pe_queue[0] <= de_queue[0] else 0
    elif choice == "split":
        pe_len, _ = split_read(cached_len, pe_queue, de_queue, block_size)
    else:
        raise DualpathError(f"read choice {choice!r}; choices: {', '.join(READ_CHOICES)}")
    de_len = cached_len - pe_len
    pe_queue[0] += pe_len
    de_queue[0] += de_len
    side: ReadSide = "split" if pe_len and de_len else ("de" if de_len else "pe")
    return side, pe_len, de_len


def assign_prefill(
    view: PrefillFetchView, config: SchedulerConfig, pe_choice: str, read_choice: str
) -> PrefillPlan:
    """Assign PEs (and read sides) to a FIFO prefix of ``view.queue``.

    ``least-loaded``: among engines with ``tok_e <= beta`` pick C2 (node ``read_q <= alpha``)
    before C3, smallest ``tok_e`` first. ``round-robin``: the next engine at or after the cursor
    with ``tok_e <= beta``. Each assignment adds ``prompt_len`` to the engine's ``tok_e``; the
    fetch stops at the first request for which no engine qualifies (C2 and C3 empty).
    """
    if pe_choice not in PE_CHOICES:
        raise DualpathError(f"pe choice {pe_choice!r}; choices: {', '.join(PE_CHOICES)}")
    ids: list[int] = []
    nodes: list[int] = []
    tok: list[int] = []
    for group in view.groups:
        for engine in group.engines:
            ids.append(engine.engine_id)
            nodes.append(group.node_id)
            tok.append(engine.num_tokens)
    reads = _Reads(view.read_queues)
    node_queues = [reads.get(n) for n in nodes]
    num = len(ids)
    cursor = view.rr_cursor % num if num else 0
    alpha, beta = config.alpha_tokens, config.beta_tokens
    out: list[PrefillAssignment] = []
    for pending in view.queue:
        if pe_choice == "least-loaded":
            pick = _least_loaded(tok, node_queues, alpha, beta)
        else:
            pick = _round_robin(tok, beta, cursor)
            if pick >= 0:
                cursor = (pick + 1) % num
        if pick < 0:
            break
        req = pending.request
        tok[pick] += req.prompt_len
        side, pe_len, de_len = choose_read(
            read_choice, req.cached_len, node_queues[pick], reads.get(pending.de_node_id),
            config.block_size,
        )
        out.append(PrefillAssignment(request_id=req.request_id, engine_id=ids[pick],
                                     read_side=side, pe_read_len=pe_len, de_read_len=de_len))
    return PrefillPlan(assignments=tuple(out), read_queues=reads.freeze(), next_rr_cursor=cursor)


def _least_loaded(tok: list[int], node_queues: list[list[float]], alpha: int, beta: int) -> int:
    best, best_cls, best_tok = -1, 2, 0
    for i, t in enumerate(tok):
        if t > beta:
            continue  # C1: overloaded, never chosen
        cls = 0 if node_queues[i][0] <= alpha else 1  # C2 = 0, C3 = 1
        if best < 0 or cls < best_cls or (cls == best_cls and t < best_tok):
            best, best_cls, best_tok = i, cls, t
    return best


def _round_robin(tok: list[int], beta: int, cursor: int) -> int:
    num = len(tok)
    for step in range(num):
        i = (cursor + step) % num
        if tok[i] <= beta:
            return i
    return -1
