"""Bytes per weight and compute bits of the kernel tables' dtypes (cost/kernels.py, memory.py)."""

from __future__ import annotations

DTYPE_BYTES = {
    "bfloat16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,
    "nvfp4": 0.5625,
    "w4a16_mxfp4": 0.53,
    "int4_wo": 0.53,
    "w4afp8": 0.53,
    "int8_wo": 1.0,
    "w4a16_nvfp4": 0.5625,
}
# weight-only int4 / int8 / mxfp4 / nvfp4 compute in BF16, W4AFP8 in FP8
DTYPE_BITS = {
    "bfloat16": 16,
    "fp8": 8,
    "fp8_block": 8,
    "nvfp4": 4,
    "w4a16_mxfp4": 16,
    "int4_wo": 16,
    "w4afp8": 8,
    "int8_wo": 16,
    "w4a16_nvfp4": 16,
}
