"""Collective times: TensorRT-LLM's custom all-reduce and NCCL tables, else a ring (hierarchical
across NVLink domains) over the system's links.
"""

from __future__ import annotations

from dualpath.cost.kernel_base import KernelBase, OpTime

CUSTOM_ALLREDUCE_MAX_BYTES = {"vllm": 8 << 20, "sglang": 8 << 20}


def _custom_allreduce(backend: str, num_bytes: float) -> bool:
    """Whether ``backend`` all-reduces ``num_bytes`` with its one-shot / two-shot NVLink kernel:
    TensorRT-LLM always (its custom all-reduce); vLLM up to its ``CustomAllreduce`` ``max_size``
    of 8 MiB (vllm/distributed/device_communicators/custom_all_reduce.py; the kernel is adapted
    from TensorRT-LLM's, so that table prices it), SGLang likewise (its custom all-reduce is
    vLLM's); NCCL above."""
    if backend == "trtllm":
        return True
    limit = CUSTOM_ALLREDUCE_MAX_BYTES.get(backend)
    return limit is not None and num_bytes <= limit


class CollectiveKernels(KernelBase):
    """The collectives of ``KernelTables`` (cost/kernels.py)."""

    __slots__ = ()

    def _hierarchical(
        self, op: str, elements: float, num_gpus: int, dtype_bytes: float, backend: str
    ) -> OpTime:
        """``op`` over ``nodes`` NVLink domains, as NCCL runs it hierarchically: the collective
        inside each domain (its table), and between the domains each GPU exchanges its
        ``1 / domain`` share of the buffer with its peers over the network (a ring of ``nodes``:
        ``2 (nodes - 1) / nodes`` of that share for an all-reduce, ``(nodes - 1) / nodes`` for the
        others), plus one point-to-point latency per hop between domains."""
        domain = self.system.nvlink_domain_gpus
        nodes = num_gpus // domain
        inside = self.collective(
            op, elements=elements, num_gpus=domain, dtype_bytes=dtype_bytes, backend=backend
        )
        share = (2.0 if op == "all_reduce" else 1.0) * (nodes - 1) / nodes
        wire_s = share * elements / domain * dtype_bytes / (self.system.inter_node_gbs * 1e9)
        between_s = wire_s + (nodes - 1) * self.system.p2p_latency_s
        return OpTime(
            inside.time_s + between_s, f"{inside.source} within each node + ring of {nodes} nodes between"
        )

    def collective(
        self, op: str, *, elements: float, num_gpus: int, dtype_bytes: float = 2.0, backend: str = "trtllm"
    ) -> OpTime:
        """``op`` (all_reduce, all_gather, reduce_scatter, alltoall) of ``elements`` values."""
        if num_gpus <= 1 or elements <= 0:
            return OpTime(0.0, "none (one GPU)")
        if op == "all_reduce" and dtype_bytes == 2.0 and _custom_allreduce(backend, elements * dtype_bytes):
            grid = self._grid(
                "comm",
                "custom_allreduce_perf",
                ("message_size",),
                (1,),
                num_gpus=num_gpus,
                allreduce_dtype="bfloat16",
            )
            if grid is not None:
                return self._from(grid, f"custom_allreduce_perf {num_gpus} GPUs", elements)
        nccl_dtype = "half" if dtype_bytes >= 2 else "int8"
        grid = self._grid(
            "comm", "nccl_perf", ("message_size",), (1,), op_name=op, num_gpus=num_gpus, nccl_dtype=nccl_dtype
        )
        if grid is not None:
            return self._from(grid, f"nccl_perf {op} {num_gpus} GPUs", elements)
        domain = self.system.nvlink_domain_gpus
        if num_gpus > domain and num_gpus % domain == 0 and domain > 1:
            return self._hierarchical(op, elements, num_gpus, dtype_bytes, backend)
        # ring: all-reduce moves 2 (n-1)/n of the buffer per GPU, the others (n-1)/n
        share = (2.0 if op == "all_reduce" else 1.0) * (num_gpus - 1) / num_gpus
        wire_s = share * elements * dtype_bytes / self.system.link_bytes_per_s(num_gpus)
        return self._fallback(
            wire_s + (num_gpus - 1) * self.system.p2p_latency_s,
            f"ring over {num_gpus} GPUs ({self._why_not('nccl_perf', op)[10:]})",
            lambda kt: kt.collective(
                op, elements=elements, num_gpus=num_gpus, dtype_bytes=dtype_bytes, backend=backend
            ),
            floor_s=wire_s,
        )
