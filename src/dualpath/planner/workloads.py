"""The planner's request lists: (arrival, input tokens, output tokens) for one finite run.

- ``io`` (default): ``num_requests`` at ``rate_rps`` (deterministic spacing ``1/rate``, or Poisson
  gaps), O = ``output_len``, I = O x ``io_ratio``; both drawn from a normal distribution around
  the target with coefficient of variation ``length_cv``, rounded and clipped at 1 token.
- ``agentic``: the project's synthetic agent trajectories (workload.synthetic, MaxLen
  ``AGENTIC_MAXLEN``); every turn re-prefills its whole context (no prefix cache), generates its
  ``gen_len``. Turns are taken wave by wave (every agent's turn 0, then turn 1, ...) and issued
  open loop at the same rate.
- ``chatbot``: the Azure LLM conversation trace's (ContextTokens, GeneratedTokens), first
  ``num_requests`` rows, issued at the same rate. Needs the shared data (``DUALPATH_DATA_DIR``).

Same arguments -> the identical list (numpy ``default_rng(seed)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from dualpath.core.errors import ConfigError, require
from dualpath.core.paths import DATA_DIR_ENV
from dualpath.workload import TRACE_FILES, generate_trajectories, iter_turn_requests, load_azure
from dualpath.workload.traces import resolve_trace

WORKLOADS: Final = ("io", "agentic", "chatbot")
AGENTIC_MAXLEN: Final = 32768  # the smallest calibrated Table 2 bucket
AGENTIC_AGENTS_PER_TURN: Final = 64  # agents whose turns interleave (wave order)
CHATBOT_TRACE: Final = "azure-conv"


@dataclass(frozen=True, slots=True, kw_only=True)
class Requests:
    """A finite request list: arrival seconds, input and output token counts (same length)."""

    arrival_s: tuple[float, ...]
    input_len: tuple[int, ...]
    output_len: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def total_tokens(self) -> int:
        return sum(self.input_len) + sum(self.output_len)

    @property
    def mean_input(self) -> float:
        return sum(self.input_len) / len(self)

    @property
    def mean_output(self) -> float:
        return sum(self.output_len) / len(self)


def _arrivals(num: int, rate_rps: float, arrivals: str, rng: np.random.Generator) -> list[float]:
    require(rate_rps > 0, "rate_rps", rate_rps, "must be > 0")
    if arrivals == "uniform":
        return [i / rate_rps for i in range(num)]
    require(arrivals == "poisson", "arrivals", arrivals, "choices: uniform, poisson")
    return [float(x) for x in np.cumsum(rng.exponential(1.0 / rate_rps, size=num)) - 0.0]


def _lengths(rng: np.random.Generator, target: float, cv: float, num: int) -> list[int]:
    draws = rng.normal(target, cv * target, size=num)
    return [max(1, int(round(x))) for x in draws]


def make_requests(
    *,
    workload: str = "io",
    num_requests: int = 500,
    rate_rps: float = 125.0,
    io_ratio: float = 1.0,
    output_len: int = 1000,
    length_cv: float = 0.1,
    seed: int = 0,
    arrivals: str = "uniform",
) -> Requests:
    """The request list of one run (see the module docstring)."""
    require(workload in WORKLOADS, "workload", workload, f"choices: {', '.join(WORKLOADS)}")
    require(num_requests >= 1, "num_requests", num_requests, "must be >= 1")
    require(output_len >= 1, "output_len", output_len, "must be >= 1")
    require(0 <= length_cv < 1, "length_cv", length_cv, "must be in [0, 1)")
    require(io_ratio > 0, "io_ratio", io_ratio, "must be > 0")
    rng = np.random.default_rng(seed)
    arr = _arrivals(num_requests, rate_rps, arrivals, np.random.default_rng([seed, 1]))
    if workload == "io":
        target_in = max(1.0, output_len * io_ratio)
        ins = _lengths(rng, target_in, length_cv, num_requests)
        outs = _lengths(rng, float(output_len), length_cv, num_requests)
    elif workload == "agentic":
        ins, outs = _agentic(num_requests, seed)
    else:
        ins, outs = _chatbot(num_requests)
    return Requests(arrival_s=tuple(arr), input_len=tuple(ins), output_len=tuple(outs))


def _agentic(num: int, seed: int) -> tuple[list[int], list[int]]:
    trajs = generate_trajectories(AGENTIC_MAXLEN, AGENTIC_AGENTS_PER_TURN, seed=seed)
    turns = [list(iter_turn_requests(t)) for t in trajs]
    ins: list[int] = []
    outs: list[int] = []
    wave = 0
    while len(ins) < num:
        live = [ts[wave] for ts in turns if wave < len(ts)]
        if not live:  # every agent done: start the next set of agents
            trajs = generate_trajectories(AGENTIC_MAXLEN, AGENTIC_AGENTS_PER_TURN, seed=seed + 1 + len(ins))
            turns = [list(iter_turn_requests(t)) for t in trajs]
            wave = 0
            continue
        for req in live[: num - len(ins)]:
            ins.append(req.prompt_len)  # the whole context is prefilled again
            outs.append(req.gen_len)
        wave += 1
    return ins, outs


def _chatbot(num: int) -> tuple[list[int], list[int]]:
    path = resolve_trace(CHATBOT_TRACE)
    if not path.exists():
        raise ConfigError(
            "workload",
            "chatbot",
            f"needs the Azure conversation trace {TRACE_FILES[CHATBOT_TRACE]} "
            f"under the data directory ({path} not found); set {DATA_DIR_ENV}",
        )
    trajs = load_azure(path, limit=num)
    require(len(trajs) > 0, "workload", "chatbot", f"no rows in {path}")
    ins = [t.turns[0].append_len for t in trajs]
    outs = [t.turns[0].gen_len for t in trajs]
    while len(ins) < num:  # a short trace file repeats
        ins.append(ins[len(ins) % len(trajs)])
        outs.append(outs[len(outs) % len(trajs)])
    return ins, outs
