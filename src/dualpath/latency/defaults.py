"""Each backend's scheduler defaults, by version: what one engine iteration may hold.

The benchmark simulation (latency/engine.py) steps an engine iteration by iteration under these
limits; each value is the backend's documented default for the version the row names (read from
the backend's code or docs, cited per field in :data:`SOURCES` and docs/plan.md). Where a row gives
no version, or one older than any rule here, the newest rules apply and the JSON says so.

- **vLLM V1** (``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``, OpenAI API server
  context, the one ``vllm serve`` and Dynamo's vLLM worker create): on a GPU of 70 GiB or more
  that is not an A100, ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024; below it 2048 and
  256. V1 always chunks prefills and mixes them with decode in one token budget (running requests
  first). Async scheduling (the scheduler one step ahead of the GPU) is on by default from v0.14.0
  (release notes, PR #27614); before, each step is scheduled after the previous one's outputs.
- **SGLang** (``python/sglang/srt/server_args.py``): ``chunked_prefill_size`` by GPU memory (8192
  on 60-160 GB GPUs, 16384 above), ``max_prefill_tokens`` 16384, ``enable_mixed_chunk`` False
  (prefill batches run apart from decode, which pauses), the overlap scheduler on since v0.4
  (lmsys blog 2024-12-04), ``schedule_policy`` fcfs (with no prefix reuse LPM orders the same).
- **TensorRT-LLM** (PyTorch backend, LLM API ``BuildConfig`` / ``TorchLlmArgs``): in-flight
  batching under ``max_num_tokens`` 8192 and ``max_batch_size`` 2048, ``enable_chunked_prefill``
  False (whole prompts), the ``GUARANTEED_NO_EVICT`` capacity scheduler (a request starts only
  when its whole KV, prompt + output, can be reserved), the overlap scheduler on
  (``disable_overlap_scheduler`` False; its docs: "introduces one extra decoding step").
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dualpath.core.errors import require

GIB = 1 << 30
BACKENDS = ("trtllm", "vllm", "sglang")
ADMISSIONS = ("reserve_full", "on_demand")

SOURCES = {
    "vllm.budget": "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (OpenAI API server, >= 70 GiB)",
    "vllm.async": "vLLM v0.14.0 release notes: async scheduling on by default (PR #27614)",
    "vllm.chunked": "vLLM V1 scheduler: chunked prefill always on, decode first in the token budget",
    "sglang.chunk": "sglang/srt/server_args.py: chunked_prefill_size by GPU memory, max_prefill_tokens 16384",
    "sglang.mixed": "sglang/srt/server_args.py: enable_mixed_chunk False (prefill apart from decode)",
    "sglang.overlap": "SGLang overlap scheduler on by default since v0.4 (lmsys blog 2024-12-04)",
    "trtllm.budget": "TensorRT-LLM BuildConfig: max_num_tokens 8192, max_batch_size 2048",
    "trtllm.capacity": "TensorRT-LLM SchedulerConfig: GUARANTEED_NO_EVICT (docs, useful runtime flags)",
    "trtllm.overlap": "TensorRT-LLM PyTorch backend: overlap scheduler on (docs, features/overlap-scheduler)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerDefaults:
    """The limits one engine iteration is scheduled under (see the module doc).

    ``token_budget``: tokens an iteration may hold, decode rows included; ``prefill_tokens``: prompt
    tokens a prefill batch may hold (SGLang's ``min(chunked_prefill_size, max_prefill_tokens)``,
    else the budget); ``max_running``: requests running at once; ``chunked_prefill``: a prompt
    that does not fit the budget left is cut (else it waits); ``mixed``: prefill and decode share
    an iteration (else prefill batches run alone and decode pauses); ``overlap``: the scheduler
    runs one step ahead of the GPU (a finished request rides one more step, a new one waits one
    more); ``admission``: ``reserve_full`` starts a request only when prompt + output KV fits,
    ``on_demand`` allocates as tokens come and preempts the newest request when the pool is full.
    """

    backend: str
    version: str
    token_budget: int
    prefill_tokens: int
    max_running: int
    chunked_prefill: bool
    mixed: bool
    overlap: bool
    admission: str
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require(self.backend in BACKENDS, "backend", self.backend, f"choices: {', '.join(BACKENDS)}")
        require(self.token_budget >= 1, "token_budget", self.token_budget, "must be >= 1")
        require(self.prefill_tokens >= 1, "prefill_tokens", self.prefill_tokens, "must be >= 1")
        require(self.max_running >= 1, "max_running", self.max_running, "must be >= 1")
        require(self.admission in ADMISSIONS, "admission", self.admission, f"choices: {ADMISSIONS}")

    @property
    def extra_steps(self) -> int:
        """Iterations a finished request still rides (1 under an overlapped scheduler)."""
        return 1 if self.overlap else 0

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"0.5.1.post1"`` -> ``(0, 5, 1)``; ``"1.2.0rc6.post1"`` -> ``(1, 2, 0)``; None / '' -> None."""
    if not text or not text.strip():
        return None
    parts = re.findall(r"\d+", text.strip().split("rc")[0].split(".post")[0].split("+")[0])
    return tuple(int(p) for p in parts[:3]) if parts else None


def scheduler_defaults(backend: str, version: str | None, capacity_bytes: float) -> SchedulerDefaults:
    """The defaults of ``backend`` at ``version`` on a GPU of ``capacity_bytes`` (module doc)."""
    require(backend in BACKENDS, "backend", backend, f"choices: {', '.join(BACKENDS)}")
    parsed = parse_version(version)
    notes: list[str] = []
    if parsed is None:
        notes.append(f"no {backend} version given: the newest defaults here apply")
    label = version.strip() if version and version.strip() else "newest"
    if backend == "vllm":
        big = capacity_bytes >= 70 * GIB
        async_on = parsed is None or parsed >= (0, 14, 0)
        return SchedulerDefaults(
            backend=backend,
            version=label,
            token_budget=8192 if big else 2048,
            prefill_tokens=8192 if big else 2048,
            max_running=1024 if big else 256,
            chunked_prefill=True,
            mixed=True,
            overlap=async_on,
            admission="on_demand",
            notes=tuple(notes),
        )
    if backend == "sglang":
        chunk = _sglang_chunked_prefill_size(capacity_bytes)
        return SchedulerDefaults(
            backend=backend,
            version=label,
            token_budget=chunk,
            prefill_tokens=min(chunk, 16384),
            max_running=4096,  # derived from the KV pool by SGLang; the pool binds first here
            chunked_prefill=True,
            mixed=False,
            overlap=parsed is None or parsed >= (0, 4, 0),
            admission="on_demand",
            notes=tuple(notes),
        )
    return SchedulerDefaults(
        backend=backend,
        version=label,
        token_budget=8192,
        prefill_tokens=8192,
        max_running=2048,
        chunked_prefill=False,
        mixed=True,
        overlap=True,
        admission="reserve_full",
        notes=tuple(notes),
    )


def _sglang_chunked_prefill_size(capacity_bytes: float) -> int:
    """SGLang's ``chunked_prefill_size`` tiers by GPU memory (server_args): 2048 below 35 GB, 4096
    below 60 GB, 8192 below 160 GB, 16384 above."""
    gb = capacity_bytes / GIB
    if gb < 35:
        return 2048
    if gb < 60:
        return 4096
    if gb < 160:
        return 8192
    return 16384
