"""``dualpath check``: the real data path (store, both read paths, layerwise prefill, decode) against
transformers on the default model."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from dualpath.cli._common import (
    check_choice,
    choices_help,
    default_of,
    print_json,
    print_table,
    require_serve_extra,
)
from dualpath.runtime.check_config import CHECK_TRANSPORTS, MESSAGES, PATHS, CheckConfig
from dualpath.runtime.choices import KV_BACKEND_NAMES


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
    app.command(name="check")(check)


def _option(name: str, text: str) -> Any:
    return typer.Option(default_of(CheckConfig, name), help=text)


def check(
    model: str = _option("model", "Model name, Hugging Face folder or .gguf file."),
    turns: int = _option("turns", f"Conversation turns per path (at most {len(MESSAGES)})."),
    paths: str = typer.Option(
        ",".join(default_of(CheckConfig, "paths")), help=choices_help("Comma-separated paths", PATHS)
    ),
    block_size: int = _option("block_size", "KV block size in tokens."),
    gen_len: int = _option("gen_len", "Tokens generated per turn (greedy)."),
    tolerance: float = _option(
        "tolerance", "Max allowed |logit difference| over the logits' scale (max |logit|; fp32)."
    ),
    device: str = typer.Option("", help="cpu or cuda (default: cuda when present)."),
    transport: str = _option(
        "transport",
        choices_help(
            "How KV moves between the engines (inproc: a call; else each engine's own transport)",
            CHECK_TRANSPORTS,
        ),
    ),  # fmt: skip
    kv_backend: str = _option(
        "kv_backend",
        choices_help("Where the store keeps the blocks turns reload (docs/kvstore.md)", KV_BACKEND_NAMES),
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run multi-turn chats through the engines and compare tokens and logits with transformers.

    Exits 1 when tokens differ or a logit differs by more than the tolerance times the logits'
    scale (the largest |logit|); the absolute maximum is printed too."""
    require_serve_extra("check")
    check_choice("transport", transport, CHECK_TRANSPORTS)
    check_choice("kv backend", kv_backend, KV_BACKEND_NAMES)
    from dualpath.runtime.kvstore.backends import check_available

    check_available(kv_backend)  # its package missing: one error line naming it, now

    from dualpath.runtime.model import default_device

    cfg = CheckConfig(model=model, turns=turns, paths=tuple(p.strip() for p in paths.split(",") if p.strip()),
                      block_size=block_size, gen_len=gen_len, tolerance=tolerance,
                      device=device or default_device(), transport=transport,
                      kv_backend=kv_backend)  # fmt: skip
    report = _run_with_progress(cfg)
    if json_out:
        print_json(report)
    else:
        _print_report(report)
    if not report["ok"]:
        raise typer.Exit(1)


def _run_with_progress(cfg: CheckConfig) -> dict[str, Any]:
    """run_check with a progress bar on stderr, one step per turn."""
    from dualpath.cli.progress import Progress
    from dualpath.runtime.engine.check import run_check

    with Progress(
        f"dualpath check: {cfg.model}, paths {', '.join(cfg.paths)}, transport {cfg.transport}, "
        f"kv backend {cfg.kv_backend}",
        total=len(cfg.paths) * cfg.turns,
        console=_stderr(),
    ) as bar:
        return run_check(cfg, on_turn=bar.advance)


def _print_report(report: dict[str, Any]) -> None:
    """The per-turn table and the one-line verdict."""
    rows = [(r["path"], r["conversation"], r["turn"], r["read_side"], r["prompt_len"], r["hit_tokens"],
             r["max_abs_logit_diff"], r["rel_logit_diff"], r["tokens_equal"])
            for r in report["per_turn"]]  # fmt: skip
    print_table(
        f"dualpath check: {report['model']} ({report['device']}, fp32, transport {report['transport']}, "
        f"kv backend {report['kv_backend']})",
        [
            "path",
            "conversation",
            "turn",
            "read side",
            "prompt (tokens)",
            "store hits (tokens)",
            "max |logit diff|",
            "/ max |logit|",
            "tokens equal",
        ],
        rows,
        legend=[
            "path: pe / de = every turn reads its cached KV on the prefill / decode "
            "engine; split = divided between them; mixed = two conversations batched, on opposite read sides "
            "that swap every turn. max |logit diff|: largest absolute difference "
            "from transformers' logits (fp32); / max |logit|: that over the largest |logit| (the check's "
            "tolerance is on this)."
        ],
    )
    verdict = "OK" if report["ok"] else "MISMATCH"
    typer.echo(f"{verdict}: max_abs_logit_diff={report['max_abs_logit_diff']:.3g} "
               f"(logit scale {report['logit_scale']:.3g}; relative {report['max_rel_logit_diff']:.3g}, "
               f"tolerance {report['tolerance']:.3g}) tokens_equal={report['tokens_equal']} "
               f"wall_s={report['wall_s']:.1f}")  # fmt: skip


def _stderr() -> Console:
    return Console(stderr=True)
