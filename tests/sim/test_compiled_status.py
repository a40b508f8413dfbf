from __future__ import annotations

import os

from dualpath.sim import compiled


def test_status_lists_every_module_once() -> None:
    st = compiled.status()
    assert sorted(st["compiled"] + st["pure"]) == sorted(compiled.MODULES)
    assert set(st["stale"]) <= set(st["compiled"])
    assert compiled.is_compiled() == (not st["pure"])


def test_only_checkout_builds_can_be_stale(tmp_path) -> None:
    so = tmp_path / "src" / "dualpath" / "sim" / "links.cpython-311-x86_64-linux-gnu.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"")
    assert not compiled._in_checkout(str(so))  # no setup.py: e.g. site-packages of an install
    (tmp_path / "setup.py").write_text("")
    assert compiled._in_checkout(str(so))
    wheel = tmp_path / "lib" / "python3.11" / "site-packages" / "dualpath" / "sim" / "links.so"
    assert not compiled._in_checkout(str(wheel))


def test_source_root_is_this_checkout() -> None:
    root = compiled.source_root()
    assert os.path.exists(os.path.join(root, "setup.py"))
    assert os.path.isdir(os.path.join(root, "src", "dualpath", "sim"))
