"""Test data for every test: the small slices shipped in ``tests/data`` (same layout as the reference
data, so named traces and kernel tables resolve there) stand in for ``$DUALPATH_DATA_DIR``.

A test that needs the full reference data takes the ``reference_data`` fixture: it points
``DUALPATH_DATA_DIR`` at the reference data (``$DUALPATH_DATA_DIR`` as set when pytest started, else
``../shared/data`` beside the checkout) and skips, saying how to get it, when that is absent; such
tests carry the ``reference_data`` marker (``-m reference_data`` runs only them; .ci/run does).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath.core.paths import DATA_DIR_ENV, data_dir

TEST_DATA_DIR = Path(__file__).resolve().parent / "data"
REFERENCE_DATA_DIR = data_dir()  # read once, before any test overrides the variable
REFERENCE_MISSING = (
    f"needs the full reference data (traces, kernel tables), not found at {REFERENCE_DATA_DIR}: "
    f"set {DATA_DIR_ENV} to a copy of it (Mooncake FAST25 traces, Azure LLM 2023 traces, "
    "aiconfigurator perf-db; origins in tests/data/README.md) or place it at ../shared/data"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that take ``reference_data`` (``-m reference_data`` runs just those)."""
    for item in items:
        if "reference_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.reference_data)


def _is_reference(path: Path) -> bool:
    return (path / "traces").is_dir() and (path / "hardware").is_dir() and path.resolve() != TEST_DATA_DIR


@pytest.fixture(scope="session", autouse=True)
def shipped_data() -> Iterator[Path]:
    """Every test (and every fixture, whatever its scope) reads the shipped slices unless it asks
    for ``reference_data``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DATA_DIR_ENV, str(TEST_DATA_DIR))
        yield TEST_DATA_DIR


@pytest.fixture
def reference_data(monkeypatch: pytest.MonkeyPatch, shipped_data: Path) -> Path:
    """The full reference data folder (and ``DUALPATH_DATA_DIR`` set to it), or a skip."""
    if not _is_reference(REFERENCE_DATA_DIR):
        pytest.skip(REFERENCE_MISSING)
    monkeypatch.setenv(DATA_DIR_ENV, str(REFERENCE_DATA_DIR))
    return REFERENCE_DATA_DIR
