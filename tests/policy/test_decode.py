"""DE selection: phase 1 routing and phase 2 assignment properties (spec section 8)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.policy import (
    DecodeFetchView,
    EngineLoad,
    GroupLoad,
    GroupTotal,
    RequestInfo,
    SchedulerConfig,
    make_scheduler,
)

DE_POLICIES = ("dualpath", "basic")


@st.composite
def requests(draw: st.DrawFn, prefix: str, max_size: int = 12) -> tuple[RequestInfo, ...]:
    n = draw(st.integers(0, max_size))
    return tuple(
        RequestInfo(
            request_id=f"{prefix}{i}",
            cached_len=draw(st.integers(0, 5000)),
            new_len=draw(st.integers(1, 800)),
            gen_len=draw(st.integers(0, 300)),
        )
        for i in range(n)
    )


@st.composite
def decode_views(draw: st.DrawFn) -> DecodeFetchView:
    num = draw(st.integers(1, 6))
    engines = tuple(
        EngineLoad(
            engine_id=100 + i,
            num_seqs=draw(st.integers(0, 5)),
            num_tokens=draw(st.integers(0, 20_000)),
            free_hbm_tokens=draw(st.integers(0, 15_000)),
        )
        for i in range(num)
    )
    num_groups = draw(st.integers(1, 4))
    totals = tuple(GroupTotal(group_id=g, num_tokens=draw(st.integers(0, 50_000))) for g in range(num_groups))
    return DecodeFetchView(
        now_s=draw(st.floats(0, 1e4)),
        group=GroupLoad(group_id=0, node_id=5, engines=engines),
        private_queue=draw(requests("p")),
        global_queue=draw(requests("g")),
        group_totals=totals,
        rr_cursor=draw(st.integers(0, 10)),
        group_rr_cursor=draw(st.integers(0, 10)),
    )


@settings(max_examples=60, deadline=None)
@given(decode_views(), st.sampled_from(DE_POLICIES))
def test_phase2_never_overcommits_hbm_and_pops_fifo(view: DecodeFetchView, name: str) -> None:
    plan = make_scheduler(name).assign_decode(view)
    assert [r.request_id for r in plan.routings] == [r.request_id for r in view.global_queue]
    queue = list(view.private_queue) + [
        r for r, g in zip(view.global_queue, plan.routings, strict=True) if g.group_id == 0
    ]
    assert [a.request_id for a in plan.assignments] == [r.request_id for r in queue[: len(plan.assignments)]]
    free = {e.engine_id: e.free_hbm_tokens for e in view.group.engines}
    for a, req in zip(plan.assignments, queue, strict=False):
        free[a.engine_id] -= req.decode_len
        assert free[a.engine_id] >= 0, "over-committed DE HBM"
    if len(plan.assignments) < len(queue):  # stopped: the head fits no DE
        head = queue[len(plan.assignments)]
        assert all(f < head.decode_len for f in free.values())


@settings(max_examples=60, deadline=None)
@given(decode_views())
def test_balanced_choice_follows_z_rule(view: DecodeFetchView) -> None:
    plan = make_scheduler("dualpath").assign_decode(view)
    engines = view.group.engines
    seq = {e.engine_id: e.num_seqs for e in engines}
    tok = {e.engine_id: e.num_tokens for e in engines}
    free = {e.engine_id: e.free_hbm_tokens for e in engines}
    queue = list(view.private_queue) + [
        r for r, g in zip(view.global_queue, plan.routings, strict=True) if g.group_id == 0
    ]
    room, fit = sum(free.values()), 0
    for r in queue:
        if fit + r.decode_len > room:
            break
        fit += r.decode_len
    z = 1.05 * (fit + sum(tok.values())) / len(engines)
    for a, req in zip(plan.assignments, queue, strict=False):
        need = req.decode_len
        fits = [e for e in free if free[e] >= need]
        under = [e for e in fits if tok[e] + need <= z]
        if under:
            assert a.engine_id in under
            assert seq[a.engine_id] == min(seq[e] for e in under)
        else:
            assert tok[a.engine_id] == min(tok[e] for e in fits)
        seq[a.engine_id] += 1
        tok[a.engine_id] += need
        free[a.engine_id] -= need


@settings(max_examples=60, deadline=None)
@given(decode_views())
def test_phase1_routes_to_least_loaded_group(view: DecodeFetchView) -> None:
    plan = make_scheduler("dualpath").assign_decode(view)
    totals = {g.group_id: g.num_tokens for g in view.group_totals}
    for req, routing in zip(view.global_queue, plan.routings, strict=True):
        assert totals[routing.group_id] == min(totals.values())
        totals[routing.group_id] += req.decode_len


@settings(max_examples=40, deadline=None)
@given(decode_views(), st.sampled_from(DE_POLICIES))
def test_identical_views_identical_plans(view: DecodeFetchView, name: str) -> None:
    copy = DecodeFetchView(**{f: getattr(view, f) for f in view.__struct_fields__})
    assert make_scheduler(name).assign_decode(view) == make_scheduler(name).assign_decode(copy)


def test_round_robin_cursors_advance() -> None:
    engines = tuple(
        EngineLoad(engine_id=i, num_seqs=0, num_tokens=0, free_hbm_tokens=10**6) for i in range(3)
    )
    reqs = tuple(RequestInfo(request_id=f"r{i}", cached_len=10, new_len=1) for i in range(4))
    view = DecodeFetchView(
        now_s=0.0,
        group=GroupLoad(group_id=1, node_id=1, engines=engines),
        private_queue=(),
        global_queue=reqs,
        group_totals=(GroupTotal(group_id=0, num_tokens=0), GroupTotal(group_id=1, num_tokens=0)),
        rr_cursor=2,
        group_rr_cursor=1,
    )
    plan = make_scheduler("basic").assign_decode(view)
    assert [r.group_id for r in plan.routings] == [1, 0, 1, 0]
    assert [a.engine_id for a in plan.assignments] == [2, 0]
    assert (plan.next_rr_cursor, plan.next_group_rr_cursor) == (1, 1)


def test_head_of_line_blocks_fetch() -> None:
    engines = (EngineLoad(engine_id=0, num_seqs=0, num_tokens=0, free_hbm_tokens=100),)
    queue = (
        RequestInfo(request_id="big", cached_len=500, new_len=1),
        RequestInfo(request_id="small", cached_len=10, new_len=1),
    )
    view = DecodeFetchView(
        now_s=0.0,
        group=GroupLoad(group_id=0, node_id=0, engines=engines),
        private_queue=queue,
        global_queue=(),
        group_totals=(GroupTotal(group_id=0, num_tokens=0),),
    )
    assert make_scheduler("dualpath", SchedulerConfig()).assign_decode(view).assignments == ()
