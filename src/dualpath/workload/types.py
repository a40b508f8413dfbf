"""Trajectory data types: what an agent does, turn by turn, in token counts only.

A trajectory is an id plus turns of ``(append_len, gen_len)``. Replay semantics (spec section 9):
turn ``i+1``'s prompt is turn ``i``'s whole context (its prompt plus its generated tokens) followed by
turn ``i+1``'s append; decoding is forced to ``gen_len`` tokens. Nothing here does I/O.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from dualpath.core.errors import ConfigError, require


@dataclass(frozen=True, slots=True)
class Turn:
    """One agent turn: ``append_len`` new prompt tokens (tool output, user text), then ``gen_len``
    forced decode tokens. ``append_len`` may be 0 only when the turn continues a context (never
    the first turn); ``gen_len`` is at least 1."""

    append_len: int
    gen_len: int

    def __post_init__(self) -> None:
        # numpy integers are accepted and stored as plain ints (exact JSON round trips)
        object.__setattr__(self, "append_len", _as_int(self.append_len, "append_len"))
        object.__setattr__(self, "gen_len", _as_int(self.gen_len, "gen_len"))
        require(self.append_len >= 0, "append_len", self.append_len, "must be an int >= 0")
        require(self.gen_len >= 1, "gen_len", self.gen_len, "must be an int >= 1")


def _as_int(value: object, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, value, "must be an int")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(key, value, "must be an int") from None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """An agent's whole episode. ``arrival_s`` is the recorded start time (0 for synthetic ones;
    online experiments draw their own Poisson arrivals). ``parent_id`` names the trajectory a
    clone was made from (``None`` for originals); a clone's first turn is its synthetic prefix."""

    traj_id: str
    turns: tuple[Turn, ...]
    arrival_s: float = 0.0
    parent_id: str | None = field(default=None)

    def __post_init__(self) -> None:
        require(
            isinstance(self.traj_id, str) and self.traj_id != "",
            "traj_id",
            self.traj_id,
            "must be a non-empty string",
        )
        require(
            isinstance(self.turns, tuple) and len(self.turns) > 0,
            "turns",
            self.turns,
            "must be a non-empty tuple of Turn",
        )
        require(
            self.turns[0].append_len >= 1,
            "turns[0].append_len",
            self.turns[0].append_len,
            "the first turn must append at least one token",
        )

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def final_len(self) -> int:
        """Context length after the last turn: every append plus every generated token."""
        return sum(t.append_len + t.gen_len for t in self.turns)

    @property
    def total_append_len(self) -> int:
        return sum(t.append_len for t in self.turns)


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One turn as the serving system sees it.

    ``cached_len`` = context after the previous turn (0 for the first turn): the KV that can be
    loaded from storage. ``prompt_len = cached_len + append_len``; ``context_len`` after this turn
    is ``prompt_len + gen_len``. ``tool_latency_s`` is the pause before this turn is issued (0 for
    the first turn and by default)."""

    turn_index: int
    cached_len: int
    append_len: int
    prompt_len: int
    gen_len: int
    tool_latency_s: float = 0.0

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.gen_len


# Length of the synthetic first turn of a cloned agent (random tokens, gen length 1). One 64-token
# KV block: enough to make every block hash of the clone distinct from its parent's (no false
# prefix sharing), small enough not to change the trajectory's statistics.
SYNTHETIC_PREFIX_LEN = 64


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How trajectories are replayed.

    ``num_agents``: agents to run; more than the trajectories available -> clones (see
    ``expand_agents``). ``seed``: picks which trajectories get cloned. ``append_scale`` /
    ``gen_scale``: multiply every append / generation length (rounded, at least 1 token; the
    synthetic prefix turn is not scaled). ``max_len``: truncate each trajectory before the first
    turn whose context would exceed it (``None``: no limit). ``tool_latency_s``: pause between a
    turn's last token and the next turn's request (0 = the paper's setting)."""

    num_agents: int
    seed: int = 0
    append_scale: float = 1.0
    gen_scale: float = 1.0
    max_len: int | None = None
    tool_latency_s: float = 0.0
    synthetic_prefix_len: int = SYNTHETIC_PREFIX_LEN

    def __post_init__(self) -> None:
        require(
            isinstance(self.num_agents, int) and self.num_agents >= 1,
            "num_agents",
            self.num_agents,
            "must be an int >= 1",
        )
        require(isinstance(self.seed, int), "seed", self.seed, "must be an int")
        require(self.append_scale > 0, "append_scale", self.append_scale, "must be > 0")
        require(self.gen_scale > 0, "gen_scale", self.gen_scale, "must be > 0")
        require(
            self.max_len is None or self.max_len >= 2, "max_len", self.max_len, "must be None or >= 2 tokens"
        )
        require(self.tool_latency_s >= 0, "tool_latency_s", self.tool_latency_s, "must be >= 0")
        require(
            self.synthetic_prefix_len >= 1, "synthetic_prefix_len", self.synthetic_prefix_len, "must be >= 1"
        )
