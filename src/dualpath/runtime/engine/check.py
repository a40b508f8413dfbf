"""End-to-end exactness check of the data path against transformers (``dualpath check``).

A multi-turn chat (the model's chat template; random tokens if it has no tokenizer) runs through
``LocalPipeline`` on each requested path with a fresh store; every turn's greedy tokens and logits are
compared with one full transformers forward over the same weights. Paths: ``pe``, ``de`` and
``split`` (one conversation on that read path; split divides the hits between PE and DE), ``mixed`` (two conversations batched together, on opposite paths that
swap every turn, each on its own DE, with chunked prefill). ``CheckConfig.transport`` picks how KV
moves between the engines (in-process, or each engine on its own cross-process transport);
``CheckConfig.kv_backend`` where the store keeps the blocks (a Mooncake Store is started for the run).

Tolerance: relative to the logits' scale. A turn passes when its greedy tokens equal transformers'
and ``max |logit diff| / max |reference logit| <= CheckConfig.tolerance`` (default 1e-5); the
absolute maximum is reported too. Why relative, and why 1e-5: both sides compute in float32
(unit roundoff u = 2^-24, about 6e-8) and differ only in the order of their sums (fused attention,
paged KV gathers, other matmul blocking). Rounding error of a length-n sum grows like n*u at worst
and sqrt(n)*u typically, in proportion to the magnitude of what is summed, and the L residual
layers add theirs up; so the difference scales with the logits, not with a constant. Measured:
SmolLM2-135M (L = 30, widths up to 1536), max |logit| 28-31, differences 5.8e-5 to 7.7e-5, that is
2.1e-6 to 2.5e-6 of the scale (35-42 u), on the project's CPU; another CPU gave 1.03e-4 absolute
(3.3e-6 relative), which a fixed 1e-4 refused with every token equal. 1e-5 (about 170 u) is four
times the largest measured, while a data-path error (a wrong, stale or misplaced KV block) changes
a logit by a visible share of its scale and usually a greedy token, which fails the check anyway.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from dualpath.runtime.check_config import MESSAGES, OTHER_MESSAGES, PATHS, CheckConfig
from dualpath.runtime.engine.local import Generation, GenRequest, LocalConfig, LocalPipeline
from dualpath.runtime.engine.types import KVGeometry, SamplingParams
from dualpath.runtime.kvstore.backends import MooncakeSpec
from dualpath.runtime.model import Decoder, build_hf_model, load_decoder, load_tokenizer

__all__ = ["PATHS", "CheckConfig", "run_check"]


class _Chat:
    """Append-only chat token streams: each new user turn is appended as template text."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tok = tokenizer
        self.gen = torch.Generator().manual_seed(0)
        self.vocab_size = vocab_size

    def first(self, message: str) -> list[int]:
        if self.tok is None:
            return torch.randint(3, self.vocab_size, (40,), generator=self.gen).tolist()
        ids = self.tok.apply_chat_template([{"role": "user", "content": message}],
                                           add_generation_prompt=True, tokenize=True)  # fmt: skip
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def append(self, message: str) -> list[int]:
        if self.tok is None:
            return torch.randint(3, self.vocab_size, (13,), generator=self.gen).tolist()
        mark = "\x00REPLY\x00"
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark},
             {"role": "user", "content": message}], add_generation_prompt=True, tokenize=False)  # fmt: skip
        return list(self.tok.encode(text.split(mark, 1)[1], add_special_tokens=False))


def compare(hf: Any, prompt: Sequence[int], out: Generation) -> tuple[float, float, bool]:
    """(max |logit diff|, the logits' scale, greedy tokens equal) of a generation versus one full
    transformers forward; the scale is the largest |logit| of transformers' rows."""
    full = list(prompt) + list(out.tokens[:-1])
    with torch.no_grad():
        ref = hf(torch.tensor([full], device=hf.device)).logits[0, len(prompt) - 1 :].float().cpu()
    ours = torch.stack([lg.float().cpu() for lg in out.logits])
    diff, scale = (ref - ours).abs().max().item(), ref.abs().max().item()
    return diff, scale, ref.argmax(-1).tolist() == list(out.tokens)


def run_check(cfg: CheckConfig, on_turn: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run the check; returns the JSON-able report (see ``dualpath check --help``)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    dec, ckpt = load_decoder(cfg.model, device=cfg.device, dtype=torch.float32)
    hf = build_hf_model(ckpt).to(cfg.device)
    try:
        tokenizer = load_tokenizer(cfg.model)
    except Exception:  # a bare checkpoint folder: random-token conversation
        tokenizer = None
    chat = _Chat(tokenizer, dec.config.vocab_size)
    rows: list[dict[str, Any]] = []
    last_reply = ""
    with _store_service(cfg) as spec:
        for path in cfg.paths:
            rows.extend(_run_path(dec, hf, chat, cfg, path, on_turn, spec))
            if tokenizer is not None and rows:
                last_reply = tokenizer.decode(rows[-1].pop("_tokens"))
            for r in rows:
                r.pop("_tokens", None)
    max_diff = max(r["max_abs_logit_diff"] for r in rows)
    max_rel = max(r["rel_logit_diff"] for r in rows)
    equal = all(r["tokens_equal"] for r in rows)
    return {
        "model": cfg.model, "dtype": "float32", "device": cfg.device, "block_size": cfg.block_size,
        "transport": cfg.transport, "kv_backend": cfg.kv_backend,
        "turns": cfg.turns, "paths": list(cfg.paths), "max_abs_logit_diff": max_diff,
        "max_rel_logit_diff": max_rel, "logit_scale": max(r["logit_scale"] for r in rows),
        "tolerance": cfg.tolerance, "tolerance_kind": "relative to the logits' scale",
        "tokens_equal": equal, "ok": equal and max_rel <= cfg.tolerance,
        "hit_tokens": sum(r["hit_tokens"] for r in rows),
        "computed_tokens": sum(r["prompt_len"] - r["hit_tokens"] for r in rows),
        "last_reply": last_reply, "per_turn": rows, "wall_s": time.perf_counter() - start,
    }  # fmt: skip


@contextlib.contextmanager
def _store_service(cfg: CheckConfig) -> Iterator[MooncakeSpec | None]:
    """A Mooncake Store for the run (``--kv-backend mooncake``), stopped after it; else None."""
    if cfg.kv_backend != "mooncake":
        yield None
        return
    from dualpath.runtime.kvstore.mooncake_service import MooncakeService

    with tempfile.TemporaryDirectory(prefix="dualpath-check-mooncake-") as logs:
        svc = MooncakeService.start(logs)
        try:
            yield svc.spec
        finally:
            svc.stop()


def _run_path(
    dec: Decoder,
    hf: Any,
    chat: _Chat,
    cfg: CheckConfig,
    path: str,
    on_turn: Callable[[], None] | None,
    spec: MooncakeSpec | None = None,
) -> list[dict[str, Any]]:
    convs = {"a": MESSAGES} if path != "mixed" else {"a": MESSAGES, "b": OTHER_MESSAGES}
    ctx = {k: chat.first(m[0]) for k, m in convs.items()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="dualpath-check-") as kv_dir:
        geo = KVGeometry.of(dec.config, dec.dtype, cfg.block_size)
        local = LocalConfig(kv_dir=kv_dir, block_size=cfg.block_size, num_decode_engines=len(convs),
                            buffer_bytes=geo.full_block_bytes * geo.num_blocks(2048),
                            num_cache_blocks=2 * geo.num_blocks(2048),
                            max_batch_tokens=48, batching="tokens" if path == "mixed" else None,
                            transport=cfg.transport, kv_backend=cfg.kv_backend,
                            mooncake=None if spec is None else replace(spec, namespace=f"check-{path}"))  # fmt: skip
        with LocalPipeline(dec, local) as pipe:
            for turn in range(cfg.turns):
                reqs = [GenRequest(request_id=f"{k}{turn}", token_ids=tuple(ctx[k]),
                                   read_side=_side(path, k, turn), decode_engine=i,  # type: ignore[arg-type]
                                   sampling=SamplingParams(max_tokens=cfg.gen_len))
                        for i, k in enumerate(convs)]  # fmt: skip
                outs = pipe.generate(reqs)
                for req in reqs:
                    out = outs[req.request_id]
                    diff, scale, equal = compare(hf, req.token_ids, out)
                    rows.append({"path": path, "conversation": req.request_id[0], "turn": turn,
                                 "read_side": out.read_side, "prompt_len": len(req.token_ids),
                                 "hit_tokens": out.hit_tokens, "gen_len": len(out.tokens),
                                 "max_abs_logit_diff": diff, "logit_scale": scale,
                                 "rel_logit_diff": diff / scale if scale > 0 else diff, "tokens_equal": equal,
                                 "_tokens": list(out.tokens)})  # fmt: skip
                    k = req.request_id[0]
                    if turn + 1 < cfg.turns:
                        ctx[k] = ctx[k] + list(out.tokens) + chat.append(convs[k][turn + 1])
                if on_turn is not None:
                    on_turn()
    return rows


def _side(path: str, conv: str, turn: int) -> str:
    if path != "mixed":
        return path
    return "pe" if (turn + (conv == "b")) % 2 == 0 else "de"
