"""``memsim_widget.fast_dataclass.dataclass`` makes the classes ``dataclasses.dataclass`` makes: the same fields,
signature, ``repr`` text, equality, hash values, frozen errors, ``replace``, ``asdict`` and pickling.

Each class below is defined twice from one source text, once by each decorator, in two modules; every check
compares the two (the standard library is the specification).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import pickle
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

#: The shapes this package writes (and a few more): plain and frozen, defaults, factories, init=False fields,
#: keyword-only fields, __post_init__, no field, one field, a field named like the generated code's names, a frozen
#: subclass, an undocumented class, and the shapes handed to the standard library whole.
SOURCE = '''
from __future__ import annotations
import dataclasses
from dataclasses import InitVar, field
from typing import Any, ClassVar

@dataclass(frozen=True)
class Frozen:
    """A frozen record."""
    a: int
    b: Any = None
    c: tuple[int, ...] = ()
    d: list[int] = field(default_factory=list, compare=False)
    e: float = field(default=1.5, repr=False)
    f: int = field(default=0, hash=False)

@dataclass
class Plain:
    """A mutable record."""
    a: Any
    b: dict[str, int] = field(default_factory=dict)
    n: ClassVar[int] = 3

@dataclass(frozen=True)
class Empty:
    """No field."""

@dataclass(frozen=True)
class One:
    """One field."""
    a: Any

@dataclass
class Undocumented:
    x: int
    y: str = "y"

@dataclass(frozen=True)
class Derived(Frozen):
    """A frozen subclass with a field of its own."""
    g: str = "g"

@dataclass(frozen=True)
class Later:
    """A field left out of __init__, set by __post_init__, and a keyword-only one."""
    a: Any
    later: Any = field(init=False, repr=False, compare=False)
    k: int = field(default=2, kw_only=True)
    def __post_init__(self) -> None:
        object.__setattr__(self, "later", ("post", self.a))

@dataclass
class Fresh:
    """A factory field out of __init__, and fields named as the generated code's own names."""
    _dflt_a: int = 1
    _HAS_DEFAULT_FACTORY: int = 2
    made: list[int] = field(init=False, default_factory=lambda: [7])

class Watched:
    """Not a dataclass: it sees every assignment (a dataclass below it must not write around it)."""
    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, ("seen", value))

@dataclass
class Seen(Watched):
    """A plain dataclass under a class with its own __setattr__."""
    a: Any
    b: int = 2

@dataclass
class WithInitVar:
    """An InitVar: the standard library's whole."""
    a: int
    scale: InitVar[int] = 1
    def __post_init__(self, scale: int) -> None:
        self.a *= scale

@dataclass(order=True)
class Ordered:
    """An option this decorator does not write: the standard library's whole."""
    a: int
'''
NAMES = (
    "Frozen", "Plain", "Empty", "One", "Undocumented", "Derived", "Later", "Fresh", "Seen", "WithInitVar", "Ordered",
)  # fmt: skip


def _module(name: str, decorator: Any) -> types.ModuleType:
    """The classes of ``SOURCE`` made by ``decorator``, in a module of their own (importable: pickle finds it)."""
    module = types.ModuleType(name)
    module.dataclass = decorator  # type: ignore[attr-defined]
    sys.modules[name] = module
    exec(compile(SOURCE, f"<{name}>", "exec"), module.__dict__)
    return module


from memsim_widget import fast_dataclass  # noqa: E402

STD = _module("_dc_standard", dataclasses.dataclass)
FAST = _module("_dc_fast", fast_dataclass.dataclass)


def _pair(name: str) -> tuple[Any, Any]:
    return getattr(STD, name), getattr(FAST, name)


def _field_facts(cls: Any) -> list[tuple[Any, ...]]:
    return [
        (
            f.name,
            f.type,
            f.default,
            f.default_factory is dataclasses.MISSING,
            f.init,
            f.repr,
            f.hash,
            f.compare,
            f.kw_only,
            f._field_type,
        )  # fmt: skip
        for f in cls.__dataclass_fields__.values()
    ]


@pytest.mark.parametrize("name", NAMES)
def test_the_class_is_the_standard_librarys(name: str) -> None:
    std, fast = _pair(name)
    assert _field_facts(fast) == _field_facts(std)
    p, q = std.__dataclass_params__, fast.__dataclass_params__
    assert [getattr(q, a) for a in ("init", "repr", "eq", "order", "unsafe_hash", "frozen")] == [
        getattr(p, a) for a in ("init", "repr", "eq", "order", "unsafe_hash", "frozen")
    ]
    assert str(inspect.signature(fast)) == str(inspect.signature(std))
    assert fast.__init__.__annotations__ == std.__init__.__annotations__
    assert repr(fast.__init__.__defaults__) == repr(std.__init__.__defaults__)
    assert repr(fast.__init__.__kwdefaults__) == repr(std.__init__.__kwdefaults__)
    assert fast.__doc__ == std.__doc__
    assert fast.__match_args__ == std.__match_args__
    assert (fast.__hash__ is None) == (std.__hash__ is None)
    for method in ("__init__", "__repr__", "__eq__", "__setattr__", "__delattr__"):
        if method in vars(std):
            assert getattr(fast, method).__qualname__ == getattr(std, method).__qualname__
        else:
            assert method not in vars(fast)
    assert dataclasses.is_dataclass(fast)


#: Constructor calls for each class: (args, kwargs).
CALLS: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "Frozen": [((1,), {}), ((1, "x", (2, 3)), {"d": [4], "e": 2.0, "f": 5}), ((math.nan,), {})],
    "Plain": [((None,), {}), (([1],), {"b": {"k": 1}})],
    "Empty": [((), {})],
    "One": [((1,), {}), ((math.nan,), {}), ((None,), {})],
    "Undocumented": [((1,), {}), ((2, "z"), {})],
    "Derived": [((1,), {}), ((1, 2), {"g": "h"})],
    "Later": [((1,), {}), ((1,), {"k": 3})],
    "Fresh": [((), {}), ((5, 6), {})],
    "Seen": [((1,), {}), ((1, 3), {})],
    "WithInitVar": [((2,), {}), ((2, 3), {})],
    "Ordered": [((1,), {})],
}


@pytest.mark.parametrize("name", NAMES)
def test_instances_behave_as_the_standard_librarys(name: str) -> None:
    std, fast = _pair(name)
    for args, kwargs in CALLS[name]:
        s, f = std(*args, **kwargs), fast(*args, **kwargs)
        assert repr(f).replace("_dc_fast", "_dc_standard") == repr(s)
        assert vars(f) == vars(s) or repr(vars(f)) == repr(vars(s))  # nan != nan: compare the text
        assert (f == f) == (s == s) and (f != f) == (s != s)
        assert (f == fast(*args, **kwargs)) == (s == std(*args, **kwargs))
        assert f.__eq__(s) is NotImplemented and s.__eq__(f) is NotImplemented
        if std.__hash__ is not None:
            assert hash(f) == hash(s)
        assert dataclasses.asdict(f) == dataclasses.asdict(s) or repr(dataclasses.asdict(f)) == repr(
            dataclasses.asdict(s)
        )
        assert repr(dataclasses.replace(f)).replace("_dc_fast", "_dc_standard") == repr(
            dataclasses.replace(s)
        )
        for again in (pickle.loads(pickle.dumps(f)), copy.copy(f), copy.deepcopy(f)):
            assert type(again) is fast and repr(again) == repr(f)


@pytest.mark.parametrize("name", ["Frozen", "Empty", "Derived", "Later"])
def test_a_frozen_class_refuses_assignment_and_deletion_as_the_standard_librarys(name: str) -> None:
    std, fast = _pair(name)
    s, f = std(*CALLS[name][0][0]), fast(*CALLS[name][0][0])
    for attr in ("a", "other"):
        with pytest.raises(dataclasses.FrozenInstanceError) as want:
            setattr(s, attr, 1)
        with pytest.raises(dataclasses.FrozenInstanceError) as got:
            setattr(f, attr, 1)
        assert str(got.value) == str(want.value)
        with pytest.raises(dataclasses.FrozenInstanceError) as want:
            delattr(s, attr)
        with pytest.raises(dataclasses.FrozenInstanceError) as got:
            delattr(f, attr)
        assert str(got.value) == str(want.value)


def test_a_plain_class_is_mutable_and_unhashable() -> None:
    p = FAST.Plain(1)
    p.a = 2
    assert p == FAST.Plain(2)
    with pytest.raises(TypeError, match="unhashable"):
        hash(p)


def test_each_instance_gets_its_own_factory_value() -> None:
    a, b = FAST.Plain(1), FAST.Plain(1)
    assert a.b == {} and a.b is not b.b
    assert FAST.Fresh().made == [7] and FAST.Fresh().made is not FAST.Fresh().made


def test_wrong_arguments_fail_as_the_standard_librarys() -> None:
    for call in (lambda c: c(), lambda c: c(1, 2, 3, 4, 5, 6, 7), lambda c: c(1, z=2), lambda c: c(1, a=2)):
        with pytest.raises(TypeError) as want:
            call(STD.Frozen)
        with pytest.raises(TypeError) as got:
            call(FAST.Frozen)
        assert str(got.value) == str(want.value)


def test_a_field_without_default_after_one_with_fails_as_the_standard_librarys() -> None:
    def define(decorator: Any) -> None:
        class Bad:
            __annotations__ = {"a": "int", "b": "int"}
            a = 1

        decorator(Bad)

    with pytest.raises(TypeError) as want:
        define(dataclasses.dataclass)
    with pytest.raises(TypeError) as got:
        define(fast_dataclass.dataclass)
    assert str(got.value) == str(want.value) == "non-default argument 'b' follows default argument"


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300)
@given(a=values, b=values, c=values, a2=values, f=st.integers())
def test_repr_equality_and_hash_match_the_standard_librarys_for_any_values(
    a: Any, b: Any, c: Any, a2: Any, f: int
) -> None:
    s1, s2 = STD.Frozen(a, b, (c,), f=f), STD.Frozen(a2, b, (c,), f=f)
    f1, f2 = FAST.Frozen(a, b, (c,), f=f), FAST.Frozen(a2, b, (c,), f=f)
    assert repr(f1).replace("_dc_fast", "_dc_standard") == repr(s1)
    assert (f1 == f2) == (s1 == s2) and (f1 != f2) == (s1 != s2)
    assert hash(f1) == hash(s1) and hash(f2) == hash(s2)
    assert hash(FAST.One(a)) == hash(STD.One(a)) and (FAST.One(a) == FAST.One(a2)) == (
        STD.One(a) == STD.One(a2)
    )


def test_init_is_compiled_on_first_use_and_is_then_the_standard_one() -> None:
    """A class's ``__init__`` is compiled when first looked up: by an instance (of it or of a plain subclass), by
    ``inspect.signature``, by a subclass's ``super().__init__``; a class never used compiles nothing."""
    fresh = _module("_dc_fast_lazy", fast_dataclass.dataclass)
    # (an undocumented class is documented with its signature when defined; the last two are the standard's)
    lazy = [n for n in NAMES if n not in ("Undocumented", "WithInitVar", "Ordered")]
    assert [n for n in lazy if inspect.isfunction(vars(getattr(fresh, n))["__init__"])] == []
    assert str(inspect.signature(fresh.Frozen)) == str(inspect.signature(STD.Frozen))
    assert inspect.isfunction(vars(fresh.Frozen)["__init__"])

    class Sub(fresh.Plain):  # not a dataclass: the base's __init__
        pass

    assert (
        repr(Sub([1]))
        == "test_init_is_compiled_on_first_use_and_is_then_the_standard_one.<locals>.Sub(a=[1], b={})"
    )
    assert inspect.isfunction(vars(fresh.Plain)["__init__"])

    class Own(fresh.One):
        def __init__(self) -> None:
            super().__init__(7)

    assert Own().a == 7 and inspect.isfunction(vars(fresh.One)["__init__"])
    assert not inspect.isfunction(vars(fresh.Empty)["__init__"])  # never used
