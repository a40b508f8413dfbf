"""Trace loaders (Mooncake sessions from hash chains, Azure CSV), JSONL round trips, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.workload import (
    ReplayConfig,
    expand_agents,
    generate_trajectories,
    load_azure,
    load_jsonl,
    load_mooncake,
    load_trace,
    resolve_trace,
    save_jsonl,
)


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _rec(ts: int, inp: int, out: int, hashes: list[int]) -> dict:
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": hashes}


def test_mooncake_sessions_from_hash_chains(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "mini.jsonl",
        [
            _rec(0, 1500, 100, [1, 2, 3]),  # session 0, full blocks [1, 2]
            _rec(1000, 1800, 100, [1, 2, 4, 5]),  # extends it: append 1800 - 1600
            _rec(2000, 700, 30, [1, 9]),  # one shared block only: new session
            _rec(3000, 1600, 40, [1, 2, 6, 7]),  # [1, 2] already continued: a branch, new session
            _rec(4000, 1900, 50, [1, 2, 4, 8]),  # extends turn 2 ([1, 2, 4]); prompt dropped output
        ],
    )
    trajs = load_mooncake(path)
    assert [[(t.append_len, t.gen_len) for t in tr.turns] for tr in trajs] == [
        [(1500, 100), (200, 100), (1, 50)],
        [(700, 30)],
        [(1600, 40)],
    ]
    assert [t.arrival_s for t in trajs] == [0.0, 2.0, 3.0]
    assert trajs[0].traj_id == "mini-0"


def test_mooncake_conversation_head(shipped_data: Path) -> None:
    path = resolve_trace("mooncake-conversation")
    assert path.is_relative_to(shipped_data)  # the shipped head of the trace (tests/data)
    num_lines = sum(1 for _ in path.open())
    trajs = load_mooncake("mooncake-conversation")
    assert sum(t.num_turns for t in trajs) == num_lines  # every request is one turn of one session
    multi = [t for t in trajs if t.num_turns > 1]
    assert len(multi) > 20 and max(t.num_turns for t in trajs) >= 3
    arrivals = [t.arrival_s for t in trajs]
    assert arrivals == sorted(arrivals)
    head = load_mooncake(path, limit=200)
    assert sum(t.num_turns for t in head) == 200
    assert head == load_mooncake("mooncake", limit=200)


def test_real_mooncake_conversation_trace(reference_data: Path) -> None:
    trajs = load_mooncake("mooncake-conversation")
    assert resolve_trace("mooncake").is_relative_to(reference_data)
    assert sum(t.num_turns for t in trajs) == 12031  # every request is one turn of one session
    multi = [t for t in trajs if t.num_turns > 1]
    assert len(multi) > 500 and max(t.num_turns for t in trajs) >= 5
    arrivals = [t.arrival_s for t in trajs]
    assert arrivals == sorted(arrivals)
    head = load_mooncake(resolve_trace("mooncake-conversation"), limit=200)
    assert sum(t.num_turns for t in head) == 200


def test_azure_rows_are_single_turn(tmp_path: Path) -> None:
    trajs = load_azure("azure-code")  # shipped: every 20th row of the hour
    assert len(trajs) > 400 and all(t.num_turns == 1 for t in trajs)
    assert trajs[0].arrival_s == 0.0 and trajs[-1].arrival_s > 3000
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,0\n"
    )
    a, b = load_azure(path)
    assert (a.turns[0].append_len, a.turns[0].gen_len) == (374, 44)
    assert b.turns[0].gen_len == 1 and b.arrival_s == pytest.approx(4.314579, abs=1e-6)


def test_real_azure_traces(reference_data: Path) -> None:
    code, conv = load_azure("azure-code"), load_azure("azure-conv")
    assert (len(code), len(conv)) == (8819, 19366)  # rows after the header
    assert all(t.num_turns == 1 for t in code + conv) and code[-1].arrival_s > 3000


def test_jsonl_round_trip_is_exact(tmp_path: Path) -> None:
    synth = expand_agents(generate_trajectories(32768, 20, 0), ReplayConfig(num_agents=30))
    mooncake = load_mooncake("mooncake-conversation", limit=300)
    for name, trajs in (("s", synth), ("m", mooncake)):
        path = tmp_path / f"{name}.jsonl"
        save_jsonl(trajs, path)
        assert load_jsonl(path) == trajs
        assert load_trace(path) == trajs


def test_load_trace_dispatch() -> None:
    assert load_trace("azure-conv", limit=5)[0].traj_id == "AzureLLMInferenceTrace_conv-0"
    assert len(load_trace("mooncake-synthetic", limit=50)) <= 50
    with pytest.raises(UnknownNameError, match="mooncake-conversation"):
        resolve_trace("no-such-trace")


def test_trace_alias_resolves_to_its_file() -> None:
    assert resolve_trace("mooncake") == resolve_trace("mooncake-conversation")


def test_named_trace_without_data_says_where_it_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUALPATH_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="DUALPATH_DATA_DIR") as info:
        load_trace("azure-conv")
    assert str(tmp_path) in str(info.value) and info.value.value == "azure-conv"


@pytest.mark.parametrize(
    "line,reason",
    [
        ('{"timestamp": 0, "input_length": 10', "bad Mooncake record"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 100, "output_length": 5}', "hash_ids"),
        ('{"timestamp": 0, "input_length": -3, "output_length": 5, "hash_ids": []}', "input_length"),
    ],
)
def test_bad_mooncake_names_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_rec(0, 10, 1, [1])) + "\n\n" + line + "\n")
    with pytest.raises(ConfigError, match=reason) as info:
        load_mooncake(path)
    assert info.value.key == f"{path}:3"


def test_bad_trajectory_jsonl_and_azure(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"traj_id": "a", "turns": [[5, 1]]}\n{"traj_id": "b", "turns": [[5, 0]]}\n')
    with pytest.raises(ConfigError, match="gen_len") as info:
        load_jsonl(path)
    assert info.value.key == f"{path}:2"
    csv_path = tmp_path / "a.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,x,3\n")
    with pytest.raises(ConfigError, match="bad Azure row") as info:
        load_azure(csv_path)
    assert info.value.key == f"{csv_path}:2"
    csv_path.write_text("time,in,out\n")
    with pytest.raises(ConfigError, match="header"):
        load_azure(csv_path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
