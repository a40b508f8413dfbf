"""PE selection and read side properties (spec section 8)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.policy import (
    EngineLoad,
    GroupLoad,
    NodeReadQueue,
    PendingPrefill,
    PrefillFetchView,
    RequestInfo,
    SchedulerConfig,
    make_scheduler,
)
from dualpath.policy.prefill import split_read

CONFIG = SchedulerConfig(alpha_tokens=4000, beta_tokens=6000, block_size=64)
DE_NODES = (10, 11)


@st.composite
def prefill_views(draw: st.DrawFn) -> PrefillFetchView:
    groups = []
    for g in range(draw(st.integers(1, 3))):
        engines = tuple(
            EngineLoad(
                engine_id=8 * g + i, num_seqs=draw(st.integers(0, 4)), num_tokens=draw(st.integers(0, 9000))
            )
            for i in range(draw(st.integers(1, 5)))
        )
        groups.append(GroupLoad(group_id=g, node_id=g, engines=engines))
    queue = tuple(
        PendingPrefill(
            request=RequestInfo(
                request_id=f"r{i}", cached_len=draw(st.integers(0, 5000)), new_len=draw(st.integers(1, 700))
            ),
            de_engine_id=80 + i,
            de_node_id=draw(st.sampled_from((*DE_NODES, 0))),
        )
        for i in range(draw(st.integers(0, 15)))
    )
    nodes = [g.node_id for g in groups] + list(DE_NODES)
    reads = tuple(
        NodeReadQueue(
            node_id=n,
            read_queue_tokens=draw(st.integers(0, 9000)),
            read_tokens_per_s=draw(st.floats(10.0, 1e4)),
        )
        for n in nodes
    )
    return PrefillFetchView(
        now_s=0.0, groups=tuple(groups), queue=queue, read_queues=reads, rr_cursor=draw(st.integers(0, 20))
    )


POLICIES = ("basic", "rr-shorter-queue", "always-de", "dualpath", "dualpath-split")


@settings(max_examples=60, deadline=None)
@given(prefill_views(), st.sampled_from(POLICIES))
def test_never_overloaded_fifo_and_reads_conserved(view: PrefillFetchView, name: str) -> None:
    plan = make_scheduler(name, CONFIG).assign_prefill(view)
    queue = [p.request for p in view.queue]
    assert [a.request_id for a in plan.assignments] == [
        r.request_id for r in queue[: len(plan.assignments)]
    ], "not a FIFO prefix"
    tok = {e.engine_id: e.num_tokens for g in view.groups for e in g.engines}
    node_of = {e.engine_id: g.node_id for g in view.groups for e in g.engines}
    reads = {q.node_id: q.read_queue_tokens for q in view.read_queues}
    for a, pending in zip(plan.assignments, view.queue, strict=False):
        req = pending.request
        assert tok[a.engine_id] <= CONFIG.beta_tokens, "assigned to an overloaded PE (C1)"
        if name in ("dualpath", "dualpath-split"):  # C2 before C3, then tok_e, then position
            keys = [
                (reads[node_of[e]] > CONFIG.alpha_tokens, t, pos)
                for pos, (e, t) in enumerate(tok.items())
                if t <= CONFIG.beta_tokens
            ]
            assert list(tok)[min(keys)[2]] == a.engine_id
        if name in ("rr-shorter-queue", "dualpath"):
            shorter_pe = reads[node_of[a.engine_id]] <= reads[pending.de_node_id]
            assert a.read_side == ("pe" if shorter_pe or req.cached_len == 0 else "de")
        assert a.pe_read_len + a.de_read_len == req.cached_len
        assert a.pe_read_len >= 0 and a.de_read_len >= 0
        tok[a.engine_id] += req.prompt_len
        reads[node_of[a.engine_id]] += a.pe_read_len
        reads[pending.de_node_id] += a.de_read_len
    if len(plan.assignments) < len(queue):
        assert all(t > CONFIG.beta_tokens for t in tok.values()), "stopped with C2/C3 non-empty"
    assert {q.node_id: q.read_queue_tokens for q in plan.read_queues} == reads


@settings(max_examples=40, deadline=None)
@given(prefill_views(), st.sampled_from(POLICIES))
def test_identical_views_identical_plans(view: PrefillFetchView, name: str) -> None:
    copy = PrefillFetchView(**{f: getattr(view, f) for f in view.__struct_fields__})
    sched = make_scheduler(name, CONFIG)
    assert sched.assign_prefill(view) == sched.assign_prefill(copy)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(0, 20_000),
    st.integers(0, 20_000),
    st.floats(10.0, 1e5),
    st.floats(10.0, 1e5),
    st.sampled_from([1, 16, 64]),
)
def test_split_finishes_both_sides_together(
    cached: int, q_pe: int, q_de: int, b_pe: float, b_de: float, block: int
) -> None:
    pe, de = split_read(cached, [q_pe, b_pe], [q_de, b_de], block)
    assert pe + de == cached and pe >= 0 and de >= 0
    assert pe % block == 0 or pe == cached
    makespan = max((q_pe + pe) / b_pe, (q_de + de) / b_de)
    slack = block * max(1 / b_pe, 1 / b_de) + 1e-9  # whole blocks: at most half a block off
    x = min(max((b_pe * (q_de + cached) - b_de * q_pe) / (b_pe + b_de), 0.0), cached)
    best = max((q_pe + x) / b_pe, (q_de + cached - x) / b_de)  # continuous optimum
    assert makespan <= best + slack
    whole = min(max((q_pe + cached) / b_pe, q_de / b_de), max(q_pe / b_pe, (q_de + cached) / b_de))
    assert makespan <= whole + slack  # never worse than reading the whole request on one side


def test_read_side_tie_goes_to_pe_and_all_overloaded_stops() -> None:
    group = GroupLoad(group_id=0, node_id=0, engines=(EngineLoad(engine_id=0, num_seqs=0, num_tokens=0),))
    queue = tuple(
        PendingPrefill(
            request=RequestInfo(request_id=f"r{i}", cached_len=3000, new_len=10), de_engine_id=9, de_node_id=1
        )
        for i in range(3)
    )
    reads = (NodeReadQueue(node_id=0, read_queue_tokens=0), NodeReadQueue(node_id=1, read_queue_tokens=0))
    view = PrefillFetchView(now_s=0.0, groups=(group,), queue=queue, read_queues=reads)
    plan = make_scheduler("dualpath", CONFIG).assign_prefill(view)
    # r0 -> tok 3010 (<= beta 6000) so r1 also fits; then tok 6020 > beta: fetch stops
    assert [(a.request_id, a.read_side) for a in plan.assignments] == [("r0", "pe"), ("r1", "de")]


def test_random_side_is_queue_blind_stable_and_about_half() -> None:
    """``rr-random-side`` (the naive dual-path step): each request's side comes from its id alone,
    whatever the queues say, and the sides split about 50/50."""
    from dualpath.policy.prefill import choose_read

    sides = []
    for i in range(400):
        rid = f"{i}:{i % 7}"
        a = choose_read("random", 640, [0.0], [1e9], 64, rid)  # DE queue huge: still blind
        b = choose_read("random", 640, [1e9], [0.0], 64, rid)
        assert a == b and a[1] + a[2] == 640 and a[0] in ("pe", "de")
        sides.append(a[0])
    assert 160 < sides.count("pe") < 240
    sched = make_scheduler("rr-random-side", CONFIG)
    view = PrefillFetchView(
        now_s=0.0,
        groups=(
            GroupLoad(
                group_id=0,
                node_id=0,
                engines=(
                    EngineLoad(engine_id=0, num_seqs=0, num_tokens=0),
                    EngineLoad(engine_id=1, num_seqs=0, num_tokens=0),
                ),
            ),
        ),
        queue=tuple(
            PendingPrefill(
                request=RequestInfo(request_id=f"r{i}", cached_len=640, new_len=10),
                de_engine_id=9,
                de_node_id=10,
            )
            for i in range(8)
        ),
        read_queues=(
            NodeReadQueue(node_id=0, read_queue_tokens=0),
            NodeReadQueue(node_id=10, read_queue_tokens=0),
        ),
    )
    plan = sched.assign_prefill(view)
    assert [a.engine_id for a in plan.assignments] == [0, 1] * 4  # round robin
    assert {a.read_side for a in plan.assignments} == {"pe", "de"}
    assert plan == sched.assign_prefill(view)
