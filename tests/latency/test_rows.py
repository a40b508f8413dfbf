"""CSV rows as deployments: which engine limits ``--limits auto`` picks, and the InferenceMAX
client's length range (latency/rows.py module doc: both are stated inferences)."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.latency.rows import deployment_from_row, limits_of

GAP = "source_file=/x/aic-auto-gap-analysis/data/h100_sxm/{b}/v/m.csv; silicon_concurrency=8"


def _row(backend: str, source: str) -> dict[str, str]:
    return {
        "model_path": "Qwen/Qwen3-32B",
        "system": "h100_sxm",
        "backend": backend,
        "mode": "agg",
        "isl": "1024",
        "osl": "128",
        "batch_size": "8",
        "tp_size": "2",
        "silicon_data_source": source,
    }


@pytest.mark.parametrize(
    ("backend", "chosen"), [("vllm", "aiconfigurator"), ("trtllm", "aiconfigurator"), ("sglang", "backend")]
)
def test_auto_takes_generated_limits_for_the_gap_analysis_collection(backend: str, chosen: str) -> None:
    row = _row(backend, GAP.format(b=backend))
    assert limits_of(row, backend, "auto") == chosen
    dep = deployment_from_row(row)
    assert dep.limits == chosen
    assert any("AIConfigurator-generated" in a for a in dep.assumed) == (chosen == "aiconfigurator")


def test_other_rows_keep_the_backend_defaults_and_explicit_limits_win() -> None:
    row = _row("trtllm", "source_file=2026-03-25.csv; model=X; silicon_concurrency=8")
    assert limits_of(row, "trtllm", "auto") == "backend"
    assert limits_of(_row("trtllm", GAP.format(b="trtllm")), "trtllm", "backend") == "backend"
    with pytest.raises(ConfigError, match="limits"):
        limits_of(row, "trtllm", "fastest")


def test_inferencemax_rows_draw_lengths_in_the_clients_range() -> None:
    dep = deployment_from_row(_row("vllm", "source_file=2026-03-25.csv; model=X; silicon_concurrency=8"))
    assert dep.length_range_ratio == pytest.approx(0.8)
    assert deployment_from_row(_row("vllm", GAP.format(b="vllm"))).length_range_ratio == 1.0
