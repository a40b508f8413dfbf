"""The views' hand-written ``__init__`` (compiled by mypyc to slot stores) must match their fields.

Pure Python replaces it with one generated from the fields (``views._fast_init``), so a field
added without its ``__init__`` line would only break the compiled build; this checks the source.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os

from dualpath.policy import views


def _classes() -> list[type]:
    found = {obj for _, obj in inspect.getmembers(views, inspect.isclass)  # (aliases once)
             if dataclasses.is_dataclass(obj) and obj.__module__ == views.__name__}
    return sorted(found, key=lambda c: c.__name__)


def test_every_hand_written_init_takes_and_sets_exactly_the_fields() -> None:
    source = views.__file__ if views.__file__.endswith(".py") else os.path.join(
        os.path.dirname(views.__file__), "views.py")  # a compiled build: its source beside it
    with open(source, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    checked = 0
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(views, node.name)
        if not dataclasses.is_dataclass(cls):
            continue
        init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        fields = dataclasses.fields(cls)
        assert [a.arg for a in init.args.kwonlyargs] == [f.name for f in fields], node.name
        assert not init.args.args[1:], f"{node.name}: fields must be keyword-only"
        for arg, default, field in zip(init.args.kwonlyargs, init.args.kw_defaults, fields):
            if field.default is dataclasses.MISSING:
                assert default is None, f"{node.name}.{arg.arg} has a default the field lacks"
            else:
                assert default is not None, f"{node.name}.{arg.arg} lacks the field's default"
                assert ast.literal_eval(default) == field.default, f"{node.name}.{arg.arg}"
        stored = [c.args[1].value for c in ast.walk(init) if isinstance(c, ast.Call)
                  and ast.unparse(c.func) == "object.__setattr__"]
        assert stored == [f.name for f in fields], node.name
        checked += 1
    assert checked == len(_classes()) >= 15


def _value(field: dataclasses.Field, i: int) -> object:
    """A value of the field's declared type (a compiled build checks types at construction and
    holds evaluated annotations, pure Python holds their strings)."""
    if field.name == "read_side":  # ReadSide, a Literal of str
        return "de"
    declared = field.type
    type_name = declared if isinstance(declared, str) else getattr(declared, "__name__", str(declared))
    info = views.RequestInfo(request_id="r", cached_len=1, new_len=2)
    group = views.GroupLoad(group_id=0, node_id=0, engines=())
    simple = {"int": i + 1, "float": i + 0.5, "str": f"v{i}", "RequestInfo": info, "GroupLoad": group}
    return () if type_name.startswith("tuple") else simple[type_name]


def test_views_store_what_they_are_given() -> None:
    for cls in _classes():
        kwargs = {f.name: _value(f, i) for i, f in enumerate(dataclasses.fields(cls))}
        obj = cls(**kwargs)
        assert {k: getattr(obj, k) for k in kwargs} == kwargs, cls.__name__
