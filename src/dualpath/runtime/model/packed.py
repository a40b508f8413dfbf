"""A decoder's packed weights in one file that every engine process of a host maps.

The decoder keeps its projections fused and transposed (``Decoder._pack_layer``), so the checkpoint's
tensors are converted once per process; with several engine processes of one model on a host (a
local cluster: a prefill engine, decode engines, a standby) each used to hold its own copy
(SmolLM2-135M fp32: 621 MiB each, plus the loader's transient dequantised copy). ``shared_decoder``
converts once, writes the packed tensors to ``<directory>/<key>.weights`` (atomically, under a file
lock) and maps that file read-only into every process (``MAP_PRIVATE``: pages only read stay the
page cache's, one copy for the host; a write could never reach the file). A restarted engine then
skips the checkpoint loader (no transformers import, no GGUF dequantisation): it maps the file.

File layout: ``MAGIC``, an 8-byte little-endian header length, a JSON header (the
``DecoderConfig`` fields, the dtype, the caller's ``extra`` values, each tensor's name, offset and
shape), then the tensors, each at a 64-byte aligned offset.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dualpath.core.errors import ConfigError
from dualpath.runtime.model.config import DecoderConfig
from dualpath.runtime.model.decoder import Decoder, _LayerWeights

MAGIC = b"DPWPACK1"
ALIGN = 64
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _tensors(decoder: Decoder) -> dict[str, torch.Tensor]:
    """The decoder's packed tensors by name (what ``Decoder._adopt`` takes back)."""
    out = {"embed": decoder._embed, "norm": decoder._norm, "head_t": decoder._head_t}
    for i, lw in enumerate(decoder._layers):
        for f in dataclasses.fields(lw):
            t = getattr(lw, f.name)
            if t is not None:
                out[f"layers.{i}.{f.name}"] = t
    return out


def weights_bytes(decoder: Decoder) -> int:
    """Bytes of the decoder's weights as it holds them (tied embeddings: the head's copy too)."""
    return sum(t.numel() * t.element_size() for t in _tensors(decoder).values())


def save_packed(decoder: Decoder, path: Path, extra: dict[str, Any]) -> None:
    """Write ``decoder``'s packed tensors and ``extra`` (JSON values) to ``path`` atomically."""
    tensors = {k: t.detach().to("cpu").contiguous() for k, t in _tensors(decoder).items()}
    entries, offset = [], 0
    for name, t in tensors.items():
        entries.append({"name": name, "offset": offset, "shape": list(t.shape)})
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    dtype = str(decoder.dtype).removeprefix("torch.")
    header = json.dumps({"config": dataclasses.asdict(decoder.config), "dtype": dtype,
                         "extra": extra, "tensors": entries}).encode()  # fmt: skip
    start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + len(header).to_bytes(8, "little") + header)
        for e, t in zip(entries, tensors.values(), strict=True):
            f.seek(start + e["offset"])
            f.write(t.view(torch.uint8).reshape(-1).numpy().tobytes())
        f.truncate(start + offset)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_packed(path: Path) -> tuple[Decoder, dict[str, Any]]:
    """Map ``path`` (written by ``save_packed``) read-only; a CPU decoder over the mapped pages."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ConfigError("packed weights", str(path), "not a packed weights file")
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        start = -(-f.tell() // ALIGN) * ALIGN
    raw = torch.from_file(str(path), shared=False, size=path.stat().st_size, dtype=torch.uint8)
    dtype = _DTYPES[header["dtype"]]
    cfg = header["config"]
    cfg["rope_params"] = tuple(tuple(p) for p in cfg["rope_params"])
    config = DecoderConfig(**cfg)
    t: dict[str, torch.Tensor] = {}
    for e in header["tensors"]:
        n = int(torch.Size(e["shape"]).numel()) * dtype.itemsize
        t[e["name"]] = raw[start + e["offset"] : start + e["offset"] + n].view(dtype).view(e["shape"])
    names = [f.name for f in dataclasses.fields(_LayerWeights)]
    layers = [_LayerWeights(**{k: t.get(f"layers.{i}.{k}") for k in names}) for i in range(config.num_layers)]
    dec = Decoder.__new__(Decoder)
    dec.config, dec.device, dec.dtype = config, torch.device("cpu"), dtype
    dec._adopt(layers, t["embed"], t["norm"], t["head_t"])
    return dec, header["extra"]


def shared_decoder(
    directory: str | Path, key: str, build: Callable[[], tuple[Decoder, dict[str, Any]]]
) -> tuple[Decoder, dict[str, Any]]:
    """The decoder of ``<directory>/<key>.weights``, made first with ``build`` (a decoder and its
    JSON ``extra``) by whichever process gets the lock first; every caller maps the file."""
    path = Path(directory) / f"{key}.weights"
    with open(Path(directory) / f".{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            decoder, extra = build()
            save_packed(decoder, path, extra)
            del decoder
    return load_packed(path)
