"""GPU and node tables: the GPUs (spec/gpu.py, spec/gpu_table.py) and nodes (spec/node.py).

GPU compute, HBM and power come from ai-dynamo/aiconfigurator system files
(``shared/data/hardware/aiconfigurator-systems/*_sxm.yaml``, dense tensor-core FLOPS); the per-GPU NIC
and PCIe figures from the NVIDIA DGX datasheets (DGX A100: ConnectX-6 200 Gb/s per GPU, PCIe 4;
DGX H100/H200/B200: ConnectX-7 400 Gb/s per GPU, PCIe 5). Node DRAM bandwidths of the DGX nodes are
our estimates from their CPUs' memory channels; the paper's node (``hopper-8x400``) uses its M=500 GB/s.

The GPUs of the planner's GPU catalogue (A100 40 GB, L40S, L4, A10G, T4, V100, M60) quote NVIDIA's
product datasheets (dense tensor-core TFLOPS, i.e. half the "with sparsity" figure); their NIC is
the per-GPU share of the 8-GPU AWS instance that carries them. T4 and V100 have no BF16 tensor
cores: their FP16 tensor rate stands in for ``bf16_tflops``. Every GPU implements
``spec.device.Device`` (``peak_flops(bits)``, ``mem_bytes_per_s``, ``capacity_bytes``).
"""

from __future__ import annotations

from dualpath.spec.gpu import DTYPES, GPUSpec
from dualpath.spec.gpu_table import GPUS, get_gpu
from dualpath.spec.node import NODES, NodeSpec, get_node

__all__ = ["DTYPES", "GPUS", "NODES", "GPUSpec", "NodeSpec", "get_gpu", "get_node"]
