"""The scheduler service's reporting side: request timing, validation, health, metrics, queries."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dualpath.policy.ledger import Entry
from dualpath.runtime.cluster.api import (
    ClusterHealth,
    ClusterInfo,
    MetricsSnapshot,
    RequestStats,
)
from dualpath.runtime.cluster.health_view import engine_entries
from dualpath.runtime.cluster.messages import Heartbeat, Query, QueryReply, Submit
from dualpath.runtime.cluster.sched_counters import EngineTotals
from dualpath.runtime.cluster.state import read_side
from dualpath.runtime.kvstore import chain_hashes
from dualpath.runtime.transfer.drops import merge

if TYPE_CHECKING:
    from dualpath.runtime.cluster.scheduler import SchedulerService

_SAMPLES = 4096


@dataclass(slots=True)
class _Timing:
    prompt_len: int
    hit_len: int
    submit_s: float
    dispatch_s: float | None = None
    first_s: float | None = None
    second_s: float | None = None
    num_tokens: int = 0


class Reporter:
    def __init__(self, svc: SchedulerService) -> None:
        self.svc = svc
        self.timing: dict[str, _Timing] = {}
        self.heartbeats: dict[int, Heartbeat] = {}
        self.engine_totals = EngineTotals()  # what heartbeats add up to (never backwards)
        self.down: list[str] = []
        self.deaths = 0
        self.revivals = 0
        self.counts = dict(
            num_requests=0,
            num_finished=0,
            num_failed=0,
            num_cancelled=0,
            hit_tokens=0,
            prompt_tokens=0,
            generated_tokens=0,
            failed_hit_tokens=0,
        )
        self.samples: dict[str, deque[float]] = {
            k: deque(maxlen=_SAMPLES) for k in ("ttft_s", "ttst_s", "tpot_s", "e2e_s")
        }

    # ------------------------------------------------------------------ requests
    def validate(self, msg: Submit, now: float | None = None) -> tuple[str, str] | None:
        svc, n = self.svc, len(msg.prompt_token_ids)
        if svc.hello is None:
            return "unavailable", "no live prefill and decode engine registered yet"
        now = time.monotonic() if now is None else now
        for role in ("prefill", "decode"):  # (none live: wait for one the supervisor brings back)
            if not svc.state.groups(role) and not svc.supervision.coming_back(role, now):
                return "unavailable", f"no live {role} engine, and none being restarted"
        if n == 0:
            return "bad_request", "prompt_token_ids is empty"
        if "#" in msg.request_id:  # "#" separates a request id from its dispatch attempt
            return "bad_request", f"request id {msg.request_id!r} must not contain '#'"
        vocab = svc.hello.vocab_size
        if any(t < 0 or t >= vocab for t in (*msg.prompt_token_ids, *msg.generated)):
            return "bad_request", f"token ids must be in [0, {vocab})"
        limit = svc.hello.max_context_len
        if n + msg.params.max_tokens > limit:
            return "too_long", (
                f"prompt ({n} tokens) + max_tokens ({msg.params.max_tokens}) "
                f"exceeds the model's context of {limit} tokens"
            )
        fits = self._fits(n, msg.params.max_tokens)
        if fits is not None:
            return "too_long", fits
        limit_queued = svc.args.cluster.scheduler.max_queued_requests
        if len(self.timing) >= limit_queued:
            return "queue_full", f"{len(self.timing)} requests in flight (max {limit_queued})"
        if msg.request_id in self.timing:
            return "bad_request", f"request id {msg.request_id!r} is already in flight"
        return None

    def _fits(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why a request does not fit the engines' KV pools (``--kv-cache-memory``), or None."""
        max_prompt, max_ctx = self.limits()
        if max_prompt and prompt_len > max_prompt:
            return (f"prompt ({prompt_len} tokens) exceeds the {max_prompt} tokens an engine's KV "
                    "pool holds (raise --kv-cache-memory)")  # fmt: skip
        if max_ctx and prompt_len + max_tokens > max_ctx:
            return (f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the {max_ctx} "
                    "tokens a decode engine's KV cache holds (raise --kv-cache-memory)")  # fmt: skip
        return None

    def submitted(
        self, rid: str, prompt_len: int, hit_len: int, now: float, count: bool = True, had: int = 0
    ) -> None:
        """``had``: tokens its client has already (a resubmission); ``count``: a new request."""
        self.timing[rid] = _Timing(prompt_len=prompt_len, hit_len=hit_len, submit_s=now, num_tokens=had)
        self.counts["num_requests"] += count

    def loaded(self, rid: str, hit_len: int) -> None:
        """The PE loaded and verified ``hit_len`` prompt tokens of KV (not more than planned). Hits
        count only those; a planned block that failed to load (vanished, or corrupt and
        quarantined) leaves the scheduler's index, so the next lookup checks the files again."""
        t, svc = self.timing.get(rid), self.svc
        if t is None or hit_len >= t.hit_len:
            return
        self.counts["failed_hit_tokens"] += t.hit_len - hit_len
        prompt = svc.prompts.get(rid)
        if prompt is not None and svc.store is not None:
            bs = svc.store.layout.block_size
            svc.store.forget(chain_hashes(prompt[0][: t.hit_len], bs)[hit_len // bs : hit_len // bs + 1])
        t.hit_len = hit_len

    def resumed(self, rid: str, hit_len: int) -> None:
        """The request resumes (an engine died) with ``hit_len`` tokens of its extended prompt
        (prompt + the tokens its client has) in the store: what its stats and hits count now."""
        t = self.timing.get(rid)
        if t is not None:
            t.hit_len = hit_len

    def dispatched(self, rid: str, now: float) -> None:
        t = self.timing.get(rid)
        if t is not None and t.dispatch_s is None:
            t.dispatch_s = now

    def token(self, rid: str, now: float) -> None:
        t = self.timing.get(rid)
        if t is None:
            return
        t.num_tokens += 1
        if t.first_s is None:
            t.first_s = now
        elif t.second_s is None:
            t.second_s = now

    def num_tokens(self, rid: str) -> int:
        t = self.timing.get(rid)
        return 0 if t is None else t.num_tokens

    def stats(self, rid: str, req: Entry, now: float, count_token: bool = True) -> RequestStats:
        """The request finished at ``now`` (its last token, unless ``count_token`` is False: its
        client ended it with what it had): counted, its times sampled."""
        if count_token:
            self.token(rid, now)
        t = self.timing[rid]
        first = t.first_s if t.first_s is not None else now
        ttft, e2e = first - t.submit_s, now - t.submit_s
        c, s = self.counts, self.samples
        c["num_finished"] += 1
        c["hit_tokens"] += t.hit_len
        c["prompt_tokens"] += t.prompt_len
        c["generated_tokens"] += t.num_tokens
        s["ttft_s"].append(ttft)
        s["e2e_s"].append(e2e)
        if t.second_s is not None:
            s["ttst_s"].append(t.second_s - t.submit_s)
        if t.num_tokens > 1:
            s["tpot_s"].append((now - first) / (t.num_tokens - 1))
        return RequestStats(
            prompt_len=t.prompt_len,
            hit_len=t.hit_len,
            num_generated=t.num_tokens,
            read_side=read_side(req),
            prefill_engine=req.pe,
            decode_engine=req.de,
            queue_s=(t.dispatch_s or now) - t.submit_s,
            ttft_s=ttft,
            ttst_s=None if t.second_s is None else t.second_s - t.submit_s,
            e2e_s=e2e,
        )

    def failed(self, rid: str) -> None:
        if rid in self.timing:
            self.counts["num_failed"] += 1

    def cancelled(self, rid: str) -> None:
        """Its client went away before it finished."""
        if rid in self.timing:
            self.counts["num_cancelled"] += 1

    def forget(self, rid: str) -> None:
        self.timing.pop(rid, None)

    # ------------------------------------------------------------------ engines
    def heartbeat(self, hb: Heartbeat, now: float) -> None:
        e = self.svc.state.engines.get(hb.engine_id)
        if e is None:
            return
        if not e.alive:  # declared dead, yet its process runs: take it back, emptied
            self.svc.revive(hb.engine_id, now)
        e.last_seen_s, e.rss_bytes = now, hb.rss_bytes or e.rss_bytes
        self.heartbeats[hb.engine_id] = hb
        self.engine_totals.add(hb, self.svc.supervision.pids.get(hb.engine_id, 0))

    # ------------------------------------------------------------------ queries
    def answer(self, q: Query) -> QueryReply:
        if q.what == "health":
            return QueryReply(query_id=q.query_id, health=self.health())
        if q.what == "metrics":
            return QueryReply(query_id=q.query_id, metrics=self.metrics())
        return QueryReply(query_id=q.query_id, info=self.info())

    def health(self) -> ClusterHealth:
        """Now, not history: one entry per engine (``health_view.py``); ok when a request sent
        now is served (a ready PE and DE, and no reason from the supervisor to be unhealthy)."""
        st, sv = self.svc.state, self.svc.supervision
        engines, unavailable, why = engine_entries(self.svc)
        running = sum(1 for t in self.timing.values() if t.dispatch_s is not None)
        report = sv.report if sv.report is not None and sv.supervised(time.monotonic()) else None
        reason = report.unhealthy if report is not None else ""
        return ClusterHealth(
            ok=bool(st.groups("prefill") and st.groups("decode")) and not reason,
            engines=engines,
            num_waiting=len(self.timing) - running,
            num_running=running,
            policy=self.svc.args.cluster.policy,
            down=why,
            unavailable=unavailable,
            restarts=sv.restarts(),
            reason=reason,
            standby=tuple(report.standby) if report is not None else (),
        )

    def limits(self) -> tuple[int, int]:
        """(longest prompt, longest prompt + generation) every ready engine's KV pool holds
        (0: no bound), the smallest over the engines: any of them may get the request."""
        prompt = [
            e.max_prompt_tokens for e in self.svc.state.engines.values() if e.ready and e.max_prompt_tokens
        ]
        ctx = [e.max_context_tokens for e in self.svc.state.engines.values()
               if e.ready and e.role == "decode" and e.max_context_tokens]  # fmt: skip
        return min(prompt, default=0), min(ctx, default=0)

    def info(self) -> ClusterInfo:
        h = self.svc.hello
        ctx = self.limits()[1]
        return ClusterInfo(
            model_name=h.model_name if h else "",
            max_context_len=(min(h.max_context_len, ctx) if ctx else h.max_context_len) if h else 0,
            vocab_size=h.vocab_size if h else 0,
            eos_token_id=h.eos_token_id if h else None,
            max_queued_requests=self.svc.args.cluster.scheduler.max_queued_requests,
            block_size=h.block_size if h else 64,
        )

    def metrics(self) -> MetricsSnapshot:
        totals = self.engine_totals
        paths, nics = totals.group("bytes_by_path"), totals.group("bytes_by_nic")
        st = self.svc.state.ledger
        depths = {
            "waiting": len(st.global_queue) + sum(len(q) for q in st.private.values()),
            "prefill_queue": len(st.prefill_queue),
            "in_flight": len(self.timing),
        }
        for node, q in st.read_q.items():
            depths[f"node{node}/read_q_tokens"] = q
        c, s = self.counts, self.samples
        store, write_errors = self._store_counts()
        return MetricsSnapshot(
            num_requests=c["num_requests"],
            num_finished=c["num_finished"],
            num_failed=c["num_failed"],
            num_cancelled=c["num_cancelled"],
            hit_tokens=c["hit_tokens"],
            prompt_tokens=c["prompt_tokens"],
            generated_tokens=c["generated_tokens"],
            bytes_by_path=paths,
            bytes_by_nic=nics,
            queue_depths=depths,
            ttft_s=list(s["ttft_s"]),
            ttst_s=list(s["ttst_s"]),
            tpot_s=list(s["tpot_s"]),
            e2e_s=list(s["e2e_s"]),
            engines_alive={
                role: sum(e.alive and e.role == role for e in st.engines.values())
                for role in ("prefill", "decode")
            },
            engine_deaths=self.deaths,
            engine_revivals=self.revivals,
            store_counts=store | {"failed_hit_tokens": c["failed_hit_tokens"]},
            store_write_errors=write_errors,
            messages_dropped=merge(self.svc.drops.snapshot(), totals.group("dropped")),
            engine_request_failures=totals.failed_requests,
            process_restarts=self.svc.supervision.restarts(),
            requests_retried=self.svc.supervision.retried,
        )

    def _store_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Store counters: the engines' totals (``EngineTotals``) plus the scheduler's own store."""
        counts: dict[str, int] = {}
        errors: dict[str, int] = {}
        own = self.svc.store.stats() if self.svc.store is not None else None
        totals = self.engine_totals
        parts = [(totals.group("store_counts"), totals.group("store_write_errors"))]
        if own is not None:
            parts.append((own.health_counts(), own.write_errors))
        for cnt, err in parts:
            for k, v in cnt.items():
                counts[k] = counts.get(k, 0) + v
            for k, v in err.items():
                errors[k] = errors.get(k, 0) + v
        return counts, errors
