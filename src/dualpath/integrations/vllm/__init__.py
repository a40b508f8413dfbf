"""DualPath inside vLLM: a v1 KV connector over the project's block store, and a model export.

Importing this package does not import vLLM (``export`` needs only torch/transformers); the
connector lives in ``dualpath.integrations.vllm.connector`` and is loaded by vLLM from
``--kv-transfer-config`` with ``kv_connector_module_path``. See docs/vllm.md.
"""

from __future__ import annotations

CONNECTOR_MODULE = "dualpath.integrations.vllm.connector"
CONNECTOR_CLASS = "DualPathConnector"
