"""The storage read rate behind the scheduler's alpha, never a silent constant.

The SNIC cap when there is one, else the configured ``storage_read_gbps``, else the KV directory's
read rate measured once (the machine's temp directory when the KV directory cannot take the
scratch file) and logged. ``source`` says which one the last :meth:`StorageReadRate.bytes_per_s`
call used (the scheduler's info reports it).
"""

from __future__ import annotations

import tempfile

from dualpath.core.units import gbps_to_bytes_per_s
from dualpath.runtime.cluster.config import ClusterConfig


class StorageReadRate:
    def __init__(self) -> None:
        self.source = ""
        self._measured: float | None = None

    def bytes_per_s(self, cluster: ClusterConfig) -> float:
        traffic, sched = cluster.traffic, cluster.scheduler
        if traffic.snic_gbps is not None:
            self.source = "snic cap"
            return gbps_to_bytes_per_s(traffic.snic_gbps)
        if sched.storage_read_gbps is not None:
            self.source = "configured"
            return gbps_to_bytes_per_s(sched.storage_read_gbps)
        if self._measured is None:
            self._measured = self._measure(cluster.kv_dir)
        self.source = "measured"
        return self._measured

    @staticmethod
    def _measure(kv_dir: str) -> float:
        from dualpath.runtime.kvstore.bandwidth import measure_read_bytes_per_s

        where = kv_dir
        try:
            rate = measure_read_bytes_per_s(where)
        except OSError as exc:  # e.g. a full KV directory: the machine's temp directory
            where = f"{tempfile.gettempdir()} ({where}: {exc.strerror})"
            rate = measure_read_bytes_per_s(tempfile.gettempdir())
        print(
            f"scheduler: no SNIC cap or storage_read_gbps; alpha from the read rate measured "
            f"in {where}, {rate / 1e9:.2f} GB/s",
            flush=True,
        )
        return rate
