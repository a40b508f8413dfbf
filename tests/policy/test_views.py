"""Views and plans are frozen, keyword-only records that store exactly what they are given.

They are ``msgspec.Struct`` classes (C ``__init__`` in the pure and the compiled build; one spelling
of each field). This checks, for every record class of ``policy.views``, that construction stores
each field, that defaults are the declared ones, that instances are frozen, equal by value and
hashable, and that positional arguments are refused.
"""

from __future__ import annotations

import inspect

import msgspec
import pytest

from dualpath.policy import views


def _classes() -> list[type[msgspec.Struct]]:
    found = [
        obj
        for _, obj in inspect.getmembers(views, inspect.isclass)
        if issubclass(obj, msgspec.Struct) and obj.__module__ == views.__name__
    ]
    return sorted(found, key=lambda c: c.__name__)


_INFO = views.RequestInfo(request_id="r", cached_len=1, new_len=2)
_GROUP = views.GroupLoad(group_id=0, node_id=0, engines=())


def _value(cls: type, name: str, i: int) -> object:
    """A value of the field's declared type (annotations are strings here)."""
    if name == "read_side":
        return "de"
    hint = cls.__annotations__[name]
    simple = {"int": i + 1, "float": i + 0.5, "str": f"v{i}", "bool": True, "RequestInfo": _INFO,
              "GroupLoad": _GROUP}  # fmt: skip
    return () if hint.startswith("tuple") else simple[hint]


def test_every_record_stores_its_fields_and_is_frozen() -> None:
    classes = _classes()
    assert len(classes) >= 17
    for cls in classes:
        names = cls.__struct_fields__
        kwargs = {n: _value(cls, n, i) for i, n in enumerate(names)}
        obj = cls(**kwargs)
        assert {n: getattr(obj, n) for n in names} == kwargs, cls.__name__
        assert obj == cls(**kwargs) and hash(obj) == hash(cls(**kwargs)), cls.__name__
        with pytest.raises(AttributeError):
            setattr(obj, names[0], kwargs[names[0]])
        with pytest.raises(TypeError):
            cls(*kwargs.values())  # keyword-only
        assert not hasattr(obj, "__dict__"), cls.__name__  # slotted


def test_defaults_are_the_declared_ones() -> None:
    info = views.RequestInfo(request_id="a", cached_len=3, new_len=4)
    assert info.gen_len == 0 and info.prompt_len == 7 and info.decode_len == 7
    assert views.EngineLoad(engine_id=1, num_seqs=0, num_tokens=0).free_hbm_tokens == 0
    assert views.NodeReadQueue(node_id=0, read_queue_tokens=5).read_tokens_per_s == 1.0
    fetch = views.DecodeFetchView(now_s=0.0, group=_GROUP, private_queue=(), global_queue=(), group_totals=())
    assert (fetch.rr_cursor, fetch.group_rr_cursor) == (0, 0)
    with pytest.raises(TypeError):
        views.RequestInfo(request_id="a", cached_len=3)  # a missing field is an error


def test_equal_by_value_not_across_classes() -> None:
    a = views.GroupRouting(request_id="r", group_id=1)
    b = views.DecodeAssignment(request_id="r", engine_id=1)
    assert a != b and a == views.GroupRouting(request_id="r", group_id=1)
    assert repr(a) == "GroupRouting(request_id='r', group_id=1)"
    assert msgspec.structs.replace(a, group_id=2) == views.GroupRouting(request_id="r", group_id=2)
