"""The driver-facing entry point: the Scheduler protocol, the policy registry, make_scheduler.

A policy is a combination of four choices (PE selection, DE selection, read side, batching);
the named policies below are the paper's systems and ablation steps plus split reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dualpath.core.errors import require
from dualpath.core.registry import lookup
from dualpath.policy.batch import NO_LIMITS, BatchLimits, plan_batch
from dualpath.policy.config import BATCHING_MODES, PE_SCOPES, SchedulerConfig
from dualpath.policy.decode import DE_CHOICES, assign_decode
from dualpath.policy.prefill import PE_CHOICES, READ_CHOICES, assign_prefill
from dualpath.policy.views import (
    BatchPlan,
    BatchView,
    DecodeFetchView,
    DecodePlan,
    PrefillFetchView,
    PrefillPlan,
)


class Scheduler(Protocol):
    """Pure decisions: a frozen view (with ``now_s``) in, a frozen plan out. No I/O, no clock,
    no hidden state: round-robin cursors travel in the view and come back in the plan."""

    @property
    def name(self) -> str: ...

    def assign_decode(self, view: DecodeFetchView) -> DecodePlan:
        """A DE group's fetch: route the global queue to groups, then assign this group's DEs."""
        ...

    def assign_prefill(self, view: PrefillFetchView) -> PrefillPlan:
        """A PE fetch: assign PEs and read sides to a FIFO prefix of the prefill queue."""
        ...

    def plan_prefill_batch(self, view: BatchView, limits: BatchLimits = NO_LIMITS) -> BatchPlan:
        """One PE iteration: which waiting requests (and how many tokens of each) to compute,
        within the room the engine reports (``limits``)."""
        ...


def is_central(scheduler: object) -> bool:
    """Whether ``scheduler``'s PE fetches are central (its ``pe_scope``; schedulers without
    one fetch per group)."""
    return getattr(scheduler, "pe_scope", "group") == "central"


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySpec:
    """What a named policy does. ``batching`` is its default mode (config.batching overrides);
    ``pe_scope`` its default PE scope (config.pe_scope overrides; docs/policy.md, "PE scope")."""

    name: str
    pe_choice: str
    de_choice: str
    read_choice: str
    batching: str
    description: str = ""
    pe_scope: str = "group"

    def __post_init__(self) -> None:
        require(self.pe_choice in PE_CHOICES, "pe_choice", self.pe_choice, f"choices: {PE_CHOICES}")
        require(self.de_choice in DE_CHOICES, "de_choice", self.de_choice, f"choices: {DE_CHOICES}")
        require(self.read_choice in READ_CHOICES, "read_choice", self.read_choice, f"choices: {READ_CHOICES}")
        require(self.batching in BATCHING_MODES, "batching", self.batching, f"choices: {BATCHING_MODES}")
        require(self.pe_scope in PE_SCOPES, "pe_scope", self.pe_scope, f"choices: {PE_SCOPES}")


def _spec(name: str, pe: str, de: str, read: str, batching: str, text: str) -> PolicySpec:
    return PolicySpec(
        name=name, pe_choice=pe, de_choice=de, read_choice=read, batching=batching, description=text
    )


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        _spec(
            "basic",
            "round-robin",
            "round-robin",
            "pe",
            "tokens",
            "Basic: round-robin PE/DE, every read on the PE side",
        ),
        _spec(
            "rr-shorter-queue",
            "round-robin",
            "round-robin",
            "shorter",
            "tokens",
            "dual-path loading with naive scheduling: round robin, shorter read queue",
        ),
        _spec(
            "always-de",
            "round-robin",
            "round-robin",
            "de",
            "tokens",
            "round robin, every read on the DE side",
        ),
        _spec(
            "dualpath",
            "least-loaded",
            "balanced",
            "shorter",
            "quota",
            "full DualPath: C1/C2/C3 PE choice, two-level DE choice, shorter queue, quota",
        ),
        _spec(
            "dualpath-split",
            "least-loaded",
            "balanced",
            "split",
            "quota",
            "DualPath with each request's hit blocks split across both sides (beyond the paper)",
        ),
        _spec(
            "rr-random-side",
            "round-robin",
            "round-robin",
            "random",
            "tokens",
            "dual-path loading with naive scheduling: round robin, read side 50/50 by request id",
        ),
    )
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyScheduler:
    """A Scheduler built from a PolicySpec and a SchedulerConfig. Stateless and immutable."""

    spec: PolicySpec
    config: SchedulerConfig

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def batching(self) -> str:
        return self.config.batching or self.spec.batching

    @property
    def pe_scope(self) -> str:
        """ "central": a PE fetch assigns to any live PE group; "group": the fetching group only."""
        return self.config.pe_scope or self.spec.pe_scope

    def assign_decode(self, view: DecodeFetchView) -> DecodePlan:
        return assign_decode(view, self.config, self.spec.de_choice)

    def assign_prefill(self, view: PrefillFetchView) -> PrefillPlan:
        return assign_prefill(view, self.config, self.spec.pe_choice, self.spec.read_choice)

    def plan_prefill_batch(self, view: BatchView, limits: BatchLimits = NO_LIMITS) -> BatchPlan:
        return plan_batch(view, self.config, self.batching, limits)


def make_scheduler(name: str, config: SchedulerConfig | None = None) -> PolicyScheduler:
    """Scheduler for a registered policy name (see POLICY_NAMES); unknown names list the choices."""
    spec = lookup(POLICIES, name, "policy")
    return PolicyScheduler(spec=spec, config=config if config is not None else SchedulerConfig())
