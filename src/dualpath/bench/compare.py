"""Honest comparison of systems measured on the same work: no ratio over runs that did different work.

``compare(runs, rows)`` says, before any ratio, what makes the runs not comparable: a system with
failed requests, or systems that finished different numbers of requests. Then:

- the same work (every system finished every request): the JCT ratios of ``systems.ratios``;
- different work: no JCT ratio (a wall time over different work compares nothing); instead the
  same ratios of the summed end-to-end latency over the requests every system finished (keyed by
  agent and turn), labelled as such, or none when no request was finished by all.

Oracle (free storage reads and PD transfers) bounds every other system from below; a run where it
came out slower than one of them is flagged as noise of the machine (the load changed while the
systems ran), not read as a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dualpath.bench.runner import BenchRun, total_requests
from dualpath.bench.systems import ratios

BOUND = "oracle"  # the system that bounds the others (its JCT is the shortest possible)


@dataclass(slots=True, kw_only=True)
class Comparison:
    problems: list[str] = field(default_factory=list)  # why the runs did different work
    noise: list[str] = field(default_factory=list)  # bounds that came out below what they bound
    ratios: dict[str, float] = field(default_factory=dict)  # JCT ratios (same work only)
    common_ratios: dict[str, float] = field(default_factory=dict)  # over the commonly finished
    common_requests: int = 0

    @property
    def same_work(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "same_work": self.same_work,
            "problems": self.problems,
            "noise": self.noise,
            "ratios": self.ratios,
            "common_ratios": self.common_ratios,
            "common_requests": self.common_requests,
        }


def _finished(run: BenchRun) -> dict[tuple[int | None, int], float]:
    """(agent, turn) -> end-to-end latency of every request of ``run`` that finished."""
    return {(r.agent_index, r.turn_index): r.e2e_s for r in run.results if r.ok and r.e2e_s is not None}


def compare(runs: dict[str, BenchRun], rows: dict[str, dict[str, Any]]) -> Comparison:
    out = Comparison()
    done = {name: _finished(run) for name, run in runs.items()}
    total = {name: total_requests(run) for name, run in runs.items()}
    for name, run in runs.items():
        failed = [r for r in run.results if not r.ok]
        if failed:
            out.problems.append(
                f"{name}: {len(failed)} failed request(s), e.g. {failed[0].error or 'no tokens'}"
            )
    counts = {name: len(d) for name, d in done.items()}
    if len(set(counts.values())) > 1 or any(counts[n] != total[n] for n in counts):
        out.problems.append(
            "the systems finished different numbers of requests: "
            + ", ".join(f"{n} {counts[n]} of {total[n]}" for n in counts)
        )
    if out.same_work:
        out.ratios = ratios(rows)
    else:
        common = set.intersection(*(set(d) for d in done.values())) if done else set()
        out.common_requests = len(common)
        if common:
            summed = {n: {"jct_s": sum(d[k] for k in common)} for n, d in done.items()}
            out.common_ratios = ratios(summed)
    out.noise = bound_noise(rows)
    return out


def bound_noise(rows: dict[str, dict[str, Any]]) -> list[str]:
    """A line for each system that came out faster than Oracle, the bound."""
    if BOUND not in rows:
        return []
    bound = float(rows[BOUND]["jct_s"])
    return [
        f"Oracle, the upper bound, came out slower than {name} (JCT {bound:.1f} s vs {float(r['jct_s']):.1f} s): "
        "noise of the machine (its load changed while the systems ran), not a measurement"
        for name, r in rows.items()
        if name != BOUND and float(r["jct_s"]) < bound
    ]
