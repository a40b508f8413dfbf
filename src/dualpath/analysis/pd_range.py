"""Bottleneck-free P/D ratio (spec section 6, equations 1-9), in exact rational arithmetic.

Notation: g GPUs per node, B compute-NIC bandwidth per GPU, S = storage bandwidth per node (the paper's
s x B, one SNIC per B), M DRAM bandwidth per node. Balanced scheduling spreads saturated storage reads
over all PE-DE GPU pairs: T_p = S / (D g^2) on the PE read path, T_c = S / (P g^2) on the DE read path.
Each constraint bounds x = P/D:

- ``pe_cnic_read``   (1):   2 T_p D g = 2S/g <= B               (no bound on x; feasibility only)
- ``pe_cnic_write``  (2-3): (T_p + T_c) D g <= B   =>  x >= S / (gB - S)
- ``de_cnic_read``   (4-5): (T_p + 2T_c) P g <= B  =>  x <= gB/S - 2
- ``de_cnic_write``  (6-7): (2T_p + T_c) P g <= B  =>  x <= (gB/S - 1) / 2
- ``de_dram``        (8):   (3 + 2x) S <= M        =>  x <= (M/S - 3) / 2

With S = sB these are the paper's s/(g-s), (g-2s)/s, (g-s)/(2s) and (M/(Bs) - 3)/2.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dualpath.core.errors import require

Number = int | float | Fraction | str


def _exact(key: str, value: Number) -> Fraction:
    """Decimal inputs become exact fractions (500.0 -> 500, 0.1 -> 1/10)."""
    frac = value if isinstance(value, Fraction) else Fraction(str(value))
    require(frac > 0, key, value, "must be positive")
    return frac


@dataclass(frozen=True, slots=True, kw_only=True)
class PDRange:
    """The feasible interval of P/D (prefill nodes over decode nodes).

    ``binding`` names the tightest upper-bound constraint (ties joined with ``+``); ``binding_lower``
    the lower one. ``feasible`` is False when the interval is empty or ``pe_cnic_read`` fails.
    """

    min_p_over_d: Fraction | None  # None: no P/D satisfies pe_cnic_write
    max_p_over_d: Fraction
    binding: str
    binding_lower: str
    upper_bounds: dict[str, Fraction]
    pe_cnic_read_ok: bool
    feasible: bool

    def contains(self, num_prefill: int, num_decode: int) -> bool:
        ratio = Fraction(num_prefill, num_decode)
        lower = self.min_p_over_d
        return self.feasible and lower is not None and lower <= ratio <= self.max_p_over_d


def pd_range(g: int, s: Number, b: Number, m: Number, *, storage_per_node: Number | None = None) -> PDRange:
    """P/D bounds for ``g`` GPUs/node, ``s`` SNICs/node, CNIC bandwidth ``b`` per GPU and DRAM
    bandwidth ``m`` per node (``b`` and ``m`` in the same unit, e.g. GB/s). Storage bandwidth per node
    is ``s x b`` unless ``storage_per_node`` (same unit) is given, e.g. SNICs slower than CNICs."""
    require(isinstance(g, int) and g > 0, "g", g, "must be a positive whole number of GPUs")
    s_f, b_f, m_f = _exact("s", s), _exact("B", b), _exact("M", m)
    storage = s_f * b_f if storage_per_node is None else _exact("storage_per_node", storage_per_node)
    r = g * b_f / storage  # gB / S
    lower = 1 / (r - 1) if r > 1 else None  # S >= gB: no P/D keeps the PE CNICs unsaturated
    uppers = {
        "de_cnic_read": r - 2,
        "de_cnic_write": (r - 1) / 2,
        "de_dram": (m_f / storage - 3) / 2,
    }
    upper = min(uppers.values())
    binding = "+".join(name for name, v in uppers.items() if v == upper)
    pe_read_ok = 2 * storage / g <= b_f
    return PDRange(
        min_p_over_d=lower,
        max_p_over_d=upper,
        binding=binding,
        binding_lower="pe_cnic_write",
        upper_bounds=uppers,
        pe_cnic_read_ok=pe_read_ok,
        feasible=pe_read_ok and lower is not None and 0 < lower <= upper,
    )
