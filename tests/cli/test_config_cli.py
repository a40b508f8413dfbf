"""The CLI's defaults come from the config dataclasses and its choices from the registries; bad
values exit 2 with one ``error:`` line naming the value (``simulate --node`` lists the nodes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualpath.cli._common import default_of
from dualpath.core.errors import UnknownNameError
from dualpath.policy.config import COMPUTE_QUOTA_S
from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig, TrafficConfig
from dualpath.sim.config import SimConfig
from dualpath.spec.hardware import NODES


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from dualpath.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_default_of_reads_dataclasses_and_structs() -> None:
    assert default_of(SimConfig, "snic_directions") == "shared"
    assert default_of(EngineConfig, "compute_quota_s") == COMPUTE_QUOTA_S
    assert default_of(ClusterConfig, "engine") == EngineConfig()
    assert default_of(TrafficConfig, "snic_gbps") is None
    with pytest.raises(KeyError):
        default_of(ClusterConfig, "kv_dir")  # required, no default
    with pytest.raises(KeyError):
        default_of(SimConfig, "no_such_field")


@pytest.mark.parametrize(
    "args,named",
    [
        (["simulate", "--node", "nosuch"], "node='nosuch'"),
        (["simulate", "--cost-model", "nosuch"], "cost model='nosuch'"),
        (["simulate", "--snic-directions", "half"], "snic_directions='half'"),
        (["simulate", "--snic-gbps", "-1"], "snic_gbps=-1.0"),
        (["simulate", "--system", "nosuch"], "system='nosuch'"),
        (["serve", "--kv-dir", "/nonexistent/kv", "--policy", "nosuch"], "policy='nosuch'"),
        (
            ["serve", "--kv-dir", "/nonexistent/kv", "--transport", "carrier-pigeon"],
            "transport='carrier-pigeon'",
        ),
        (["serve", "--kv-dir", "/nonexistent/kv", "--snic-gbps", "0"], "snic_gbps=0.0"),
        (
            [
                "engine",
                "--role",
                "both",
                "--scheduler",
                "127.0.0.1:9",
                "--node-id",
                "0",
                "--kv-dir",
                "/nonexistent/kv",
            ],
            "role='both'",
        ),
    ],
)
def test_bad_values_exit_2_naming_the_value(args: list[str], named: str) -> None:
    assert named in _one_error(_cli(*args))


def test_bad_node_lists_the_valid_ones() -> None:
    line = _one_error(_cli("simulate", "--node", "nosuch"))
    assert all(name in line for name in NODES)


def test_help_lists_the_registries() -> None:
    from dualpath.policy.scheduler import POLICY_NAMES

    out = _cli("serve", "--help").stdout
    flat = " ".join(out.replace("│", " ").split())
    for name in POLICY_NAMES:
        assert name in flat


def test_simulate_node_and_snic_gbps(tmp_path: Path) -> None:
    common = (
        "simulate",
        "--model",
        "ds-27b",
        "--pd",
        "1p1d",
        "--agents",
        "4",
        "--maxlen",
        "32k",
        "--system",
        "dualpath",
        "--json",
    )
    base = json.loads(_cli(*common).stdout)
    slow = json.loads(_cli(*common, "--snic-gbps", "10").stdout)
    other = json.loads(_cli(*common, "--node", "dgx-a100").stdout)
    assert "snic_gbps" not in base and "node" not in base  # the default JSON is unchanged
    assert slow["snic_gbps"] == 10.0 and other["node"] == "dgx-a100"
    jct = {
        k: r["systems"]["dualpath"]["jct_s"] for k, r in (("base", base), ("slow", slow), ("other", other))
    }
    assert jct["slow"] > jct["base"]  # 10 Gbit/s instead of 400: reads take longer
    assert jct["other"] != jct["base"]


def test_unknown_registry_names_list_choices() -> None:
    with pytest.raises(UnknownNameError, match="dgx-a100"):
        from dualpath.spec.hardware import get_node

        get_node("nosuch")
