"""Simulated requests (one agent turn each) and agents. Mutable, slotted, owned by the driver.

Times are simulated seconds; ``nan`` until the stage happens. TTFT breakdown (the paper's figure 12
categories, sim/metrics.py): scheduling = arrival -> PE assigned (the global and DE queues and the
fetch cadence), allocation = PE assigned -> every DRAM-buffer claim admitted, reading = claims
admitted -> KV read done, prefill = read done -> first token (waiting for a PE batch included).
"""

from __future__ import annotations

from array import array
from typing import Final

from dualpath.policy.views import PendingPrefill, RequestInfo

NAN: Final = float("nan")


class Req:
    """One turn. ``hit_len`` = block-aligned cached tokens (only full blocks are persisted);
    ``miss_len`` = ``prompt_len - hit_len`` tokens to compute."""

    __slots__ = (
        "rid",
        "agent",
        "turn",
        "prompt_len",
        "gen_len",
        "hit_len",
        "miss_len",
        "info",
        "de_gpu",
        "pe_gpu",
        "pe_read_len",
        "de_read_len",
        "read_side",
        "done_new",
        "claims_left",
        "out_claimed",
        "is_ready",
        "target",
        "pending",
        "t_arrive",
        "t_de",
        "t_pe",
        "t_alloc",
        "t_read",
        "t_first",
        "t_join",
        "t_done",
    )

    def __init__(
        self, agent: Agent, turn: int, cached_len: int, append_len: int, gen_len: int, block_len: int
    ) -> None:
        self.rid = agent.rid_prefix + str(turn)
        self.agent = agent
        self.turn = turn
        self.prompt_len = cached_len + append_len
        self.gen_len = gen_len
        self.hit_len = (cached_len // block_len) * block_len
        self.miss_len = self.prompt_len - self.hit_len
        self.info = RequestInfo(
            request_id=self.rid, cached_len=self.hit_len, new_len=self.miss_len, gen_len=gen_len
        )
        self.de_gpu = -1
        self.pe_gpu = -1
        self.pe_read_len = 0
        self.de_read_len = 0
        self.read_side = ""
        self.done_new = 0  # prompt tokens computed so far (chunked prefill)
        self.claims_left = 0
        self.out_claimed = False
        self.is_ready = False
        self.target = 0.0  # decode: step count at which the last token is produced
        self.pending: PendingPrefill | None = None  # built once, when it enters the prefill queue
        self.t_arrive = NAN
        self.t_de = NAN
        self.t_pe = NAN
        self.t_alloc = NAN
        self.t_read = NAN
        self.t_first = NAN
        self.t_join = NAN
        self.t_done = NAN

    @property
    def decode_len(self) -> int:
        return self.prompt_len + self.gen_len


class Agent:
    """An agent replays one trajectory turn by turn; ``turns`` are ``(append_len, gen_len)``.

    Kept packed (``turn_lens``: append, gen, append, gen, ... as 64-bit integers in one
    ``array``): a large run holds every agent's whole trajectory for its whole length and reads
    one turn per request, and a list of tuples of ints costs three cold objects a read."""

    __slots__ = (
        "index",
        "traj_id",
        "rid_prefix",
        "turn_lens",
        "num_turns",
        "next_turn",
        "context_len",
        "t_start",
        "t_end",
    )

    def __init__(self, index: int, traj_id: str, turns: list[tuple[int, int]]) -> None:
        self.index = index
        self.traj_id = traj_id
        self.rid_prefix = f"{index}:"  # its requests' ids: "<agent index>:<turn>"
        self.turn_lens = array("q", [n for turn in turns for n in turn])
        self.num_turns = len(turns)
        self.next_turn = 0
        self.context_len = 0
        self.t_start = NAN
        self.t_end = NAN

    def next_request(self, block_len: int) -> Req | None:
        """The agent's next turn, or None when the trajectory is done. Advances the agent."""
        turn = self.next_turn
        if turn >= self.num_turns:
            return None
        lens = self.turn_lens
        append_len = lens[2 * turn]
        gen_len = lens[2 * turn + 1]
        req = Req(self, turn, self.context_len, append_len, gen_len, block_len)
        self.next_turn = turn + 1
        self.context_len = req.prompt_len + gen_len
        return req
