"""vLLM 2P1D with DualPath's connector (cluster.py ``num_prefill=2``): four conversations at once
through the proxy under policy "dualpath" (read side and prefill instance chosen per request by
``dualpath.policy``, with a per-PE batch budget of 700 tokens so that one PE's fetch cannot take all
four 625-token first turns); greedy tokens equal vLLM's without a connector (prefix cache off), both
prefill instances serve turns, and later turns hit every whole block of the previous one.

Needs the vLLM venv (docs/vllm.md): three vLLM instances at once, minutes to start on a small CPU;
marked slow, skipped without vLLM (``.ci/run`` runs it with DUALPATH_VLLM_VENV).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from .conftest import pd_conversation, plain_vllm_tokens, vllm_marks

pytestmark = vllm_marks(3600)
TOPIC = "The mill by the weir ground barley for three villages, and the miller kept a tally of sacks. "
GEN = 6


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dualpath.integrations.vllm.cluster import PDCluster, PDConfig
    from dualpath.integrations.vllm.export import export_hf_folder
    from dualpath.integrations.vllm.tokens import load_tokenizer

    root = tmp_path_factory.mktemp("vllm-2p1d")
    model = root / "model"
    export_hf_folder("smollm2-135m", model)
    tok = load_tokenizer(model)
    cfg = PDConfig(
        model=str(model), root=str(root / "pd"), num_prefill=2, num_decode=1, snic_gbps=None, beta_tokens=700
    )
    with PDCluster(cfg) as cluster:
        cluster.start()
        url = cluster.url
        httpx.post(f"{url}/configure", json={"policy": "dualpath"}, timeout=30).raise_for_status()
        firsts = [tok(f"Mill {c}. " + TOPIC * 40)[:625] for c in range(4)]
        with ThreadPoolExecutor(4) as pool:
            convs = list(pool.map(lambda f: pd_conversation(url, tok, f, 2, GEN), firsts))
        prefills = sorted(i.url for i in cluster.instances if i.role == "prefill")
    prompts = [t["prompt"] for c in convs for t in c]
    return {
        "convs": convs,
        "plain": plain_vllm_tokens(model, root, prompts, GEN),
        "prefills": prefills,
    }


def test_2p1d_tokens_equal_plain_vllm(runs: dict[str, Any]) -> None:
    assert [t["tokens"] for c in runs["convs"] for t in c] == runs["plain"]


def test_both_prefill_instances_serve_and_later_turns_hit(runs: dict[str, Any]) -> None:
    used = sorted({t["prefill"] for c in runs["convs"] for t in c})
    assert used == runs["prefills"] and len(used) == 2
    for conv in runs["convs"]:
        assert conv[0]["cached_len"] == 0
        for prev, turn in zip(conv, conv[1:], strict=False):
            assert turn["cached_len"] >= len(prev["prompt"]) // 32 * 32 > 0
