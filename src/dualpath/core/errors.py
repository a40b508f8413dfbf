"""Error types. Every error names the offending key or value and, where there are any, the choices."""

from __future__ import annotations

from collections.abc import Iterable


class DualpathError(Exception):
    """Base class of every error dualpath raises on purpose."""


class ConfigError(DualpathError, ValueError):
    """A configuration value is missing, out of range or inconsistent.

    ``key`` is the field name, ``value`` the offending value; the message quotes both.
    """

    def __init__(self, key: str, value: object, reason: str) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        super().__init__(f"{key}={value!r}: {reason}")


class UnknownNameError(ConfigError, KeyError):
    """A name looked up in a table (model, hardware, policy, ...) does not exist."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        self.choices = tuple(sorted(choices))
        super().__init__(kind, name, f"unknown {kind}; choices: {', '.join(self.choices)}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0] if self.args else super().__str__()


def require(condition: bool, key: str, value: object, reason: str) -> None:
    """Raise ``ConfigError(key, value, reason)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(key, value, reason)
