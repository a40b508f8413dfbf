"""dualpath: dual-path KV-cache loading for agentic LLM inference.

Three faces over one core: ``serve`` (the real system), ``simulate`` (a cluster model) and
``plan`` (closed-form analysis). See README.md and docs/.
"""

__version__ = "0.1.0"
