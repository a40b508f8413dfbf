"""DeepSeek-V4 compressed attention: closed forms against brute force and hand counts."""

from __future__ import annotations

import random

from dualpath.spec import compressed
from dualpath.spec.model_spec import causal_kv_sum
from dualpath.spec.models import get_model


def _brute(c: int, n: int, r: int, cap: int | None) -> int:
    return sum(min(p // r, cap) if cap is not None else p // r for p in range(c + 1, c + n + 1))


def test_closed_forms_match_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(300):
        c, n, r = rng.randint(0, 3000), rng.randint(0, 700), rng.choice([1, 4, 128])
        cap = rng.choice([None, 1, 5, 512])
        assert compressed._compressed_sum(c, n, r, cap) == _brute(c, n, r, cap)
        w = rng.choice([1, 128, 4096])
        assert causal_kv_sum(c, n, w) == sum(min(p, w) for p in range(c + 1, c + n + 1))


def test_v4_kv_bytes_by_hand() -> None:
    pro = get_model("deepseek-v4-pro")
    assert pro.compress_ratios.count(4) == 30 and pro.compress_ratios.count(128) == 31
    assert pro.kv_bytes_per_token == 4460  # 30 x 576/4 + 31 x 576/128 = 4459.5, rounded up
    # 1M tokens: window 128 + n/4 or n/128 entries per layer, 576 B each (~4.36 GiB)
    n = 1 << 20
    assert pro.kv_bytes(n) == 576 * (61 * 128 + 30 * (n // 4) + 31 * (n // 128))
    flash = get_model("deepseek-v4-flash")
    assert flash.compress_ratios.count(0) == 2 and flash.kv_bytes_per_token == 3114
    assert flash.kv_bytes(100) == 576 * (43 * 100 + 21 * 25 + 20 * 0)


def test_v4_attention_flops_by_hand() -> None:
    flash = get_model("deepseek-v4-flash")
    pair = 4 * 64 * 512
    idx = 2 * 64 * 128
    # one query at position 10,001
    assert flash.attention_flops_layer(10_000, 1, layer=2) == (128 + 512) * pair + 2500 * idx  # CSA
    assert flash.attention_flops_layer(10_000, 1, layer=3) == (128 + 78) * pair  # HCA
    assert flash.attention_flops_layer(10_000, 1, layer=0) == 128 * pair  # window only
    total = 2 * 128 * pair + 21 * ((128 + 512) * pair + 2500 * idx) + 20 * (128 + 78) * pair
    assert flash.attention_flops(10_000, 1) == total
