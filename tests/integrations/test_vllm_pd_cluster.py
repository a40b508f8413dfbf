"""vLLM 1P2D with DualPath's connector (cluster.py): greedy tokens over growing conversations equal
vLLM's without a connector (prefix cache off), with the hits read on the PE side (policy "basic"),
on the DE side (policy "always-de": a decode node's agent reads and forwards them) and split across
both (policy "dualpath-split": the PE reads the prefix, the agent the rest), a partial hit, and a
block damaged on disk (a miss on the DE path: recomputed, never served). The agents' ``/metrics``
count each path's bytes.

Needs the vLLM venv (docs/vllm.md): three vLLM instances at once, minutes to start on a small CPU;
marked slow, skipped without vLLM (``.ci/run`` runs it with DUALPATH_VLLM_VENV).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .conftest import pd_conversation, plain_vllm_tokens, vllm_marks

pytestmark = vllm_marks(3600)
TOPIC = "The harbour town kept its ledgers in the tower, and every ship that came in paid a toll in salt. "
GEN = 6
CONVERSATIONS = ("pe", "de", "partial", "corrupt", "split")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dualpath.integrations.vllm.cluster import PDCluster, PDConfig
    from dualpath.integrations.vllm.conversation import corrupt_one_block
    from dualpath.integrations.vllm.export import export_hf_folder
    from dualpath.integrations.vllm.tokens import load_tokenizer

    root = tmp_path_factory.mktemp("vllm-pd")
    model = root / "model"
    export_hf_folder("smollm2-135m", model)
    tok = load_tokenizer(model)
    out: dict[str, Any] = {}
    with PDCluster(PDConfig(model=str(model), root=str(root / "pd"), snic_gbps=None)) as cluster:
        cluster.start()
        url = cluster.url

        def policy(name: str) -> None:
            httpx.post(f"{url}/configure", json={"policy": name}, timeout=30).raise_for_status()

        policy("basic")
        out["pe"] = pd_conversation(url, tok, tok("Ledger one. " + TOPIC * 8), 3, GEN)
        before = cluster.metrics()
        policy("always-de")
        out["de"] = pd_conversation(url, tok, tok("Ledger two. " + TOPIC * 8), 3, GEN)
        out["partial"] = pd_conversation(
            url,
            tok,
            out["pe"][0]["prompt"][:150] + tok(" A new question instead, about the toll records?" * 4),
            1,
            GEN,
        )
        last = out["de"][-1]["prompt"]
        out["corrupt_hash"] = corrupt_one_block(str(root / "pd" / "store"), last, 32, 1)
        out["corrupt"] = pd_conversation(url, tok, last, 1, GEN)
        out["metrics"] = (before, cluster.metrics())
        policy("dualpath-split")  # each hit read on both sides: the PE its prefix, a DE the rest
        out["split"] = pd_conversation(url, tok, tok("Ledger three. " + TOPIC * 8), 3, GEN)
        out["split_metrics"] = (out["metrics"][1], cluster.metrics())
    (root / "runs.json").write_text(json.dumps({k: out[k] for k in CONVERSATIONS}))
    prompts = [t["prompt"] for k in CONVERSATIONS for t in out[k]]
    out["plain"] = plain_vllm_tokens(model, root, prompts, GEN)
    return out


def test_tokens_equal_plain_vllm_on_both_read_paths(runs: dict[str, Any]) -> None:
    got = [t["tokens"] for k in CONVERSATIONS for t in runs[k]]
    assert got == runs["plain"]


def test_a_split_hit_is_read_on_both_sides(runs: dict[str, Any]) -> None:
    """Policy "dualpath-split" on an idle cluster: every later turn's hit is split, the prefill
    node reads its prefix and a decode node's agent forwards the rest (both counters move)."""
    conv = runs["split"]
    for prev, turn in zip(conv, conv[1:], strict=False):
        assert turn["read_side"] == "split" and turn["cached_len"] >= len(prev["prompt"]) // 32 * 32 > 0
    before, after = runs["split_metrics"]
    forwarded = sum(after[n].get("forwarded_bytes", 0) - before[n].get("forwarded_bytes", 0) for n in after)
    assert (
        forwarded > 0
        and after[0].get("forwarded_in_bytes", 0) - before[0].get("forwarded_in_bytes", 0) >= forwarded
    )
    assert after[0].get("pe_read_bytes", 0) > before[0].get("pe_read_bytes", 0)


def test_hits_are_read_on_the_side_the_policy_chose(runs: dict[str, Any]) -> None:
    pe, de = runs["pe"], runs["de"]
    assert pe[0]["cached_len"] == 0 and de[0]["cached_len"] == 0  # first turns miss
    for conv, side in ((pe, "pe"), (de, "de")):
        for prev, turn in zip(conv, conv[1:], strict=False):  # every whole block of the last turn hits
            assert turn["read_side"] == side and turn["cached_len"] >= len(prev["prompt"]) // 32 * 32 > 0
    part = runs["partial"][0]  # the shared start's whole blocks hit, the new question's miss
    assert part["cached_len"] == 150 // 32 * 32 < (part["prompt_len"] - 1) // 32 * 32
    before, after = runs["metrics"]
    forwarded = sum(after[n].get("forwarded_bytes", 0) - before[n].get("forwarded_bytes", 0) for n in after)
    de_read = sum(after[n].get("de_read_bytes", 0) - before[n].get("de_read_bytes", 0) for n in after)
    assert forwarded > 0 and de_read >= forwarded
    assert after[0].get("forwarded_in_bytes", 0) >= forwarded  # the prefill node received them
    assert after[0].get("pe_read_bytes", 0) > 0  # the "basic" conversation's reads


def test_a_corrupt_block_on_the_de_path_is_a_miss(runs: dict[str, Any]) -> None:
    before, after = runs["metrics"]
    misses = sum(after[n].get("de_read_misses", 0) - before[n].get("de_read_misses", 0) for n in after)
    assert misses >= 1
