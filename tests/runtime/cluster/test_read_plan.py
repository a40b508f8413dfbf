"""The policy's read plan reaches the engines as it is: one ``ReadSide`` (the policy's), carried in
``ReadPlan`` by both tasks, validated at decode against its lengths and the prompt."""

from __future__ import annotations

import msgspec
import pytest

from dualpath.policy import PrefillAssignment
from dualpath.policy.prefill import choose_read
from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.messages import DECODE_ERRORS, DecodeTask, PrefillTask, ReadPlan, decode, encode


@pytest.mark.parametrize("choice", ["pe", "de", "split", "shorter"])
@pytest.mark.parametrize("cached", [0, 64, 192])
def test_the_policy_assignment_round_trips_unchanged(choice: str, cached: int) -> None:
    side, pe, de = choose_read(choice, cached, [10.0, 1.0], [0.0, 1.0], 64)
    a = PrefillAssignment(request_id="r", engine_id=0, read_side=side, pe_read_len=pe, de_read_len=de)
    read = ReadPlan.of(a)
    ids = list(range(1, 300))
    for task in (
        PrefillTask(
            request_id="r", prompt_token_ids=ids, read=read, decode_engine=1, params=SamplingParams()
        ),
        DecodeTask(
            request_id="r", prompt_token_ids=ids, read=read, prefill_engine=0, params=SamplingParams()
        ),
    ):
        back = decode(encode(task))
        assert back == task and back.read == read  # type: ignore[union-attr]
        assert (back.read.side, back.read.pe_read_len, back.read.de_read_len) == (a.read_side, pe, de)  # type: ignore[union-attr]
        assert back.read.hit_len == cached  # type: ignore[union-attr]
    if choice == "split" and cached == 192:
        assert read.side == "split" and 0 < pe < cached  # (a split is its own path, not "pe")


@pytest.mark.parametrize(
    ("read", "why"),
    [
        ({"side": "pe", "pe_read_len": 0, "de_read_len": 64}, "that is 'de'"),
        ({"side": "de", "pe_read_len": 64, "de_read_len": 64}, "that is 'split'"),
        ({"side": "split", "pe_read_len": 64, "de_read_len": 0}, "that is 'pe'"),
        ({"side": "none", "pe_read_len": 0, "de_read_len": 0}, "Invalid enum value .none."),
        ({"side": "pe", "pe_read_len": -64, "de_read_len": 0}, ">= 0"),
        ({"side": "split", "pe_read_len": 64, "de_read_len": 64}, "exceed the prompt length 3"),
    ],
)
def test_a_read_plan_that_disagrees_is_refused_at_decode(read: dict, why: str) -> None:
    raw = msgspec.msgpack.encode(
        {
            "t": "PrefillTask",
            "request_id": "r",
            "prompt_token_ids": [1, 2, 3],
            "read": read,
            "decode_engine": 1,
            "params": {},
        }
    )
    with pytest.raises(DECODE_ERRORS, match=why):
        decode(raw)
