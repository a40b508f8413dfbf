"""On a failing test, the logs of every local cluster still running are added to its report."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if not rep.failed:
        return
    from dualpath.runtime.cluster.local import LocalCluster

    for c in LocalCluster.running():
        rep.sections.append((f"local cluster {c.cluster_id} logs", c.log_tails()))
