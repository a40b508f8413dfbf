"""Tiny, dependency-free building blocks: errors, units, registries."""

from dualpath.core.errors import ConfigError, DualpathError, UnknownNameError
from dualpath.core.registry import lookup

__all__ = ["ConfigError", "DualpathError", "UnknownNameError", "lookup"]
