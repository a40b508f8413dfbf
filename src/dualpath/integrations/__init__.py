"""Integrations of DualPath into other inference engines (each behind its own extra).

Nothing here is imported by ``import dualpath``; each subpackage imports its engine lazily or at
its own import. See docs/vllm.md.
"""
