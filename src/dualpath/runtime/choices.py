"""The runtime's name registries, torch-free so configs and the CLI can validate against them.

``TRANSPORT_NAMES``: the KV transports ``runtime.transfer.factory.make_transport`` knows;
``KV_BACKEND_NAMES``: the block store's backends (``runtime.kvstore.backends.open_backend``);
``DTYPES``: engine weight/KV dtypes; ``ROLES``: engine roles.
"""

from __future__ import annotations

TRANSPORT_NAMES: tuple[str, ...] = ("zmq", "shm", "mooncake", "nixl")
KV_BACKEND_NAMES: tuple[str, ...] = ("posix", "nixl-posix", "mooncake")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")
ROLES: tuple[str, ...] = ("prefill", "decode")
