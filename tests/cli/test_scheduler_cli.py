"""``dualpath scheduler``: the scheduler service alone (engines on other hosts join it; the netns
tests run a whole cluster that way). Here: it starts, makes its key, answers a keyed client and
refuses a keyless one, stops on SIGTERM; bad flags are one error line."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq")


def _cli(*argv: str, **kw: object) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "dualpath.cli", "scheduler", *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def test_it_serves_keyed_clients_only_and_stops_on_sigterm(tmp_path: Path) -> None:
    from dualpath.runtime.cluster.api import ClusterUnavailableError
    from dualpath.runtime.cluster.client import ClusterClient
    from dualpath.runtime.transfer.auth import load_keys

    key = tmp_path / "cluster.key"
    proc = _cli("--kv-dir", str(tmp_path / "kv"), "--key-file", str(key), "--create-key", "--json")
    try:
        text = ""
        while not text.endswith("}\n"):  # (one JSON object, indented)
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, proc.stderr.read()  # type: ignore[union-attr]
            text += line
        info = json.loads(text)
        assert info["authenticated"] and info["scheduler"].startswith("tcp://127.0.0.1:")
        assert key.stat().st_mode & 0o777 == 0o600

        async def health(keys: object) -> object:
            async with ClusterClient(info["scheduler"], keys=keys, query_timeout_s=5.0) as c:  # type: ignore[arg-type]
                return await c.health()

        h = asyncio.run(health(load_keys(str(key))))
        assert h.engines == () and not h.ok  # type: ignore[attr-defined]  # (no engine joined yet)
        with pytest.raises((ClusterUnavailableError, TimeoutError)):  # keyless: refused, no answer
            asyncio.run(asyncio.wait_for(health(None), 8))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.parametrize(
    "argv,names",
    [
        (["--create-key"], "create_key"),
        (["--key-file", "EXISTING", "--create-key"], "exists already"),
        (["--policy", "nope"], "nope"),
    ],
)
def test_bad_flags_are_one_error_line(tmp_path: Path, argv: list[str], names: str) -> None:
    existing = tmp_path / "k"
    existing.write_text("{}")
    argv = [str(existing) if a == "EXISTING" else a for a in argv]
    proc = _cli("--kv-dir", str(tmp_path / "kv"), *argv)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    assert names in err and "Traceback" not in err, err
