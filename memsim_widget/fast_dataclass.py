"""``dataclass``, as the standard library's, defined at a fraction of the cost: what starting ``memsim`` pays for.

Python 3.11's ``dataclasses.dataclass`` compiles one function per generated method (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, and a frozen class's ``__setattr__`` and ``__delattr__``): about 0.6 ms per class, and
``memsim estimate`` defines some 60 classes before it computes anything (issue 28: the CLI's import under 40 ms).
This decorator lets the standard library collect the fields (so ``dataclasses.fields``, ``replace``, ``asdict``
and ``is_dataclass`` see a dataclass), gives ``__repr__``, ``__eq__``, ``__hash__`` and the frozen class's
methods as plain functions over the field names (the same ``repr`` text, ``==``, ``hash`` values and
``FrozenInstanceError``, with no source to compile), and compiles ``__init__`` alone, when the class is first
used (``_LazyInit``): a process compiles the ``__init__`` of the classes it builds, not of every class it defines.

The shapes it writes itself are the ones this package uses (``@dataclass`` and ``@dataclass(frozen=True)``, with
``field(...)`` defaults, factories, ``init=False``, ``kw_only=True``, ``__post_init__``); any other option, an
``InitVar``, a ``KW_ONLY`` marker or a method the class writes itself is handed to the standard library whole.
Type checkers see the standard decorator (``TYPE_CHECKING``). tests/test_fast_dataclass.py holds both equal.
"""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
import sys
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError
from operator import attrgetter
from typing import TYPE_CHECKING, Any

#: Methods a class may write itself that this decorator would otherwise set: such a class goes to the standard one.
_OWN = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__match_args__")


class _Factory:
    """The default of a parameter whose field has a ``default_factory`` (shown ``<factory>``, as the standard's)."""

    def __repr__(self) -> str:
        return "<factory>"


_HAS_FACTORY = _Factory()


def _plain(cls: type) -> bool:
    """True if ``cls`` (and its bases) uses only what this decorator writes itself."""
    if any(name in cls.__dict__ for name in _OWN):
        return False
    for base in cls.__mro__:
        for kind in base.__dict__.get("__annotations__", {}).values():
            text = kind if isinstance(kind, str) else repr(kind)
            if "InitVar" in text or "KW_ONLY" in text:
                return False
    return True


def _direct(cls: type, fields: list[Field[Any]], frozen: bool) -> bool:
    """True if ``__init__`` may write the instance's ``__dict__`` directly: what ``object.__setattr__`` (a frozen
    class's way) or ``self.name = value`` (a plain one's) would do, with no descriptor, slot, ``__setattr__`` or
    ``__getattribute__`` in between."""
    if cls.__getattribute__ is not object.__getattribute__ or not (
        frozen or cls.__setattr__ is object.__setattr__
    ):
        return False
    for f in fields:
        for base in cls.__mro__:
            if f.name in base.__dict__:
                kind = type(base.__dict__[f.name])
                if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
                    return False
                break
    return True


def _check_defaults(fields: list[Field[Any]]) -> None:
    """The standard library's error, raised as it is, when the class is defined: a positional parameter without a
    default after one with a default."""
    seen_default = False
    for f in fields:
        if f.init and not f.kw_only:
            if f.default is not MISSING or f.default_factory is not MISSING:
                seen_default = True
            elif seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _init(cls: type, fields: list[Field[Any]], frozen: bool, post_init: bool) -> Callable[..., None]:
    """``__init__``: the standard library's (``dataclasses._init_fn``), written with less text to compile (the
    defaults set on the function rather than named in its text, the fields written to ``__dict__`` where nothing
    stands in between)."""
    self = "__dataclass_self__" if any(f.name == "self" for f in fields) else "self"
    direct = _direct(cls, fields, frozen)
    names: dict[str, Any] = {
        "_HAS_DEFAULT_FACTORY": _HAS_FACTORY,
        "__dataclass_setattr__": object.__setattr__,
    }
    params: list[str] = []
    kw_params: list[str] = []
    defaults: list[Any] = []
    kw_defaults: dict[str, Any] = {}
    body: list[str] = []
    written: dict[str, str] = {}  # direct: field -> its value's text, all written by one update (one line)
    for f in fields:
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if f.init:
            default = f.default if f.default is not MISSING else _HAS_FACTORY
            if f.kw_only:
                kw_params.append(f.name)
                if has_default:
                    kw_defaults[f.name] = default
            else:
                params.append(f.name)
                if has_default:
                    defaults.append(default)
        if f.default_factory is not MISSING:
            names[f"_dflt_{f.name}"] = f.default_factory
            value = (
                f"_dflt_{f.name}() if {f.name} is _HAS_DEFAULT_FACTORY else {f.name}"
                if f.init
                else f"_dflt_{f.name}()"
            )
        elif f.init:
            value = f.name
        else:
            continue  # the class attribute holds the default
        if direct:
            written[f.name] = value
        else:
            body.append(
                f"__dataclass_setattr__({self},{f.name!r},{value})" if frozen else f"{self}.{f.name}={value}"
            )
    if written:
        names["__dataclass_names__"] = tuple(written)
        body.append(f"{self}.__dict__.update(zip(__dataclass_names__,({','.join(written.values())},)))")
    if post_init:
        body.append(f"{self}.__post_init__()")
    args = ",".join([self, *params, *(["*", *kw_params] if kw_params else [])])
    text = "\n".join(f"  {line}" for line in body or ["pass"])
    source = f"def __create_fn__({','.join(names)}):\n def __init__({args}):\n{text}\n return __init__"
    ns: dict[str, Any] = {}
    module = sys.modules.get(cls.__module__)
    exec(source, vars(module) if module is not None else {}, ns)  # as the standard library does
    fn = ns["__create_fn__"](**names)
    fn.__defaults__ = tuple(defaults) or None  # the last len(defaults) positional parameters', as in a def
    fn.__kwdefaults__ = kw_defaults or None
    kinds = {f.name: f.type for f in fields}
    fn.__annotations__ = {**{name: kinds[name] for name in params + kw_params}, "return": None}
    fn.__qualname__ = f"{cls.__qualname__}.__init__"
    return fn


class _LazyInit:
    """A class's ``__init__`` until it is first looked up (an instance made, ``inspect.signature``, a subclass's
    ``super().__init__``): then compiled by ``_init`` and set on the class in its place. Compiling is most of what
    defining a dataclass costs; a process compiles only the ``__init__`` of the classes it uses (``memsim
    estimate`` builds 40 of the 60 it defines), when it first uses them."""

    __slots__ = ("cls", "fields", "frozen", "post_init")

    def __init__(self, cls: type, fields: list[Field[Any]], frozen: bool, post_init: bool) -> None:
        self.cls, self.fields, self.frozen, self.post_init = cls, fields, frozen, post_init

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        fn = self.cls.__dict__["__init__"]
        if fn is self:  # the first look-up
            fn = _init(self.cls, self.fields, self.frozen, self.post_init)
            setattr(self.cls, "__init__", fn)  # noqa: B010 - a class attribute, replaced
        return fn if obj is None else fn.__get__(obj, owner)


def _key(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of these attributes of an object (what the standard ``__eq__`` and ``__hash__`` compare)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _methods(cls: type, fields: list[Field[Any]], frozen: bool) -> dict[str, Any]:
    """``__repr__``, ``__eq__``, ``__hash__`` (None when not frozen), and for a frozen class ``__setattr__`` and
    ``__delattr__``: the standard library's methods, as functions over the field names."""
    shown = tuple(f.name for f in fields if f.repr)
    key = _key(tuple(f.name for f in fields if f.compare))
    hashed = _key(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
    names = frozenset(f.name for f in fields)

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    out: dict[str, Any] = {"__repr__": __repr__, "__eq__": __eq__, "__hash__": __hash__ if frozen else None}
    if frozen:
        out |= {"__setattr__": __setattr__, "__delattr__": __delattr__}
    return out


def _define(cls: type, frozen: bool) -> type:
    """``dataclasses.dataclass(cls, frozen=frozen)``, its methods written as above."""
    undocumented = not cls.__doc__
    has_bases = any(hasattr(b, "__dataclass_fields__") for b in cls.__mro__[1:])
    # The standard library collects the fields; a subclass of a frozen dataclass must say frozen (it checks).
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=frozen and has_bases)
    fields = list(dataclasses.fields(cls))  # type: ignore[arg-type]
    _check_defaults(fields)
    cls.__init__ = _LazyInit(cls, fields, frozen, hasattr(cls, "__post_init__"))  # type: ignore[misc]
    for name, fn in _methods(cls, fields, frozen).items():
        if fn is not None:
            fn.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, fn)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init, params.repr, params.eq, params.frozen = True, True, True, frozen
    if undocumented:  # the standard library's text, now that __init__ is there
        try:
            cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
        except (TypeError, ValueError):
            cls.__doc__ = cls.__name__
    return cls


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:

    def dataclass(cls: type | None = None, /, *, frozen: bool = False, **options: Any) -> Any:
        """``@dataclass`` or ``@dataclass(frozen=True)`` as ``dataclasses.dataclass``; other options go to it."""

        def wrap(c: type) -> type:
            if options or not _plain(c):
                return dataclasses.dataclass(c, frozen=frozen, **options)
            return _define(c, frozen)

        return wrap if cls is None else wrap(cls)
