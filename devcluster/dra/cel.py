"""CEL device selectors, evaluated by a maintained CEL implementation (cel-python, `celpy`).

What a selector sees is what Kubernetes' DRA CEL environment declares
(k8s.io/dynamic-resource-allocation/cel/compile.go, `deviceType` and `buildVars`):

- `device.driver` (string), `device.allowMultipleAllocations` (bool);
- `device.attributes['<domain>'].<name>`: a slice's attribute `name` without a domain belongs
  to the driver's domain, `example.com/name` to `example.com`; values are ints, bools, strings
  or versions (semver: `compareTo`, `isGreaterThan`, `isLessThan`, `major`, `minor`, `patch`,
  as Kubernetes' `semver` CEL library);
- `device.capacity['<domain>'].<name>`: a Quantity (Kubernetes' `quantity` CEL library:
  `quantity('10Gi')`, `compareTo`, `isGreaterThan`, `isLessThan`, `asInteger`,
  `asApproximateFloat`, `isInteger`, `sign`, `add`, `sub`).

Plus the string extension functions Kubernetes enables (`lowerAscii`, `upperAscii`, `trim`,
`replace`, `split`, `indexOf`...; cel-go ext.Strings) that cel-python lacks; `matches`,
`startsWith`, `endsWith`, `contains`, `size` are cel-python's own.

A runtime error (an attribute the device does not have: cel-go's "no such key: index") fails
the allocation attempt, as allocator.go selectorsMatch does ("CEL runtime error").

Limits (stated, not hidden): `==` between quantities is value equality; the CEL cost limit is
not enforced; list attributes are empty lists; cel-python's other error messages are its own.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes

from ..scheduler import parse_quantity as _strict_quantity
from ..scheduler import quantity as parse_quantity


class CelError(Exception):
    """A selector that does not compile or evaluate; the message is one line."""


class Quantity:
    """A Kubernetes resource.Quantity in CEL (apiserver/pkg/cel/library/quantity.go)."""

    def __init__(self, value: Decimal) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.value})"


class Semver:
    """A version attribute in CEL (apiserver/pkg/cel/library/semverlib.go)."""

    def __init__(self, text: str) -> None:
        core = str(text).split("-")[0].split("+")[0]
        parts = [int(p) for p in core.split(".")]
        self.parts = tuple(parts + [0] * (3 - len(parts)))[:3]
        self.text = str(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.parts)


def _cmp(a: Any, b: Any) -> int:
    left = a.value if isinstance(a, Quantity) else a.parts
    right = b.value if isinstance(b, Quantity) else b.parts
    return (left > right) - (left < right)


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(_strict_quantity(str(text)))
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ValueError(f"invalid quantity {text!r}") from exc


def _semver(text: Any) -> Semver:
    return Semver(str(text))


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value != q.value.to_integral_value():
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(int(q.value))


def _or(a: Any, b: Any) -> Any:
    """cel-go's commutative `||`: true wins over an error, an error over false (cel-python
    answers two errors with "no matching overload", hiding the first)."""
    if a is True or (isinstance(a, celtypes.BoolType) and a):
        return celtypes.BoolType(True)
    if b is True or (isinstance(b, celtypes.BoolType) and b):
        return celtypes.BoolType(True)
    for side in (a, b):
        if isinstance(side, celpy.CELEvalError):
            return side
    return celtypes.BoolType(False)


def _and(a: Any, b: Any) -> Any:
    """cel-go's commutative `&&`: false wins over an error, an error over true."""
    if isinstance(a, (bool, celtypes.BoolType)) and not isinstance(a, celpy.CELEvalError) and not a:
        return celtypes.BoolType(False)
    if isinstance(b, (bool, celtypes.BoolType)) and not isinstance(b, celpy.CELEvalError) and not b:
        return celtypes.BoolType(False)
    for side in (a, b):
        if isinstance(side, celpy.CELEvalError):
            return side
    return celtypes.BoolType(True)


FUNCTIONS: dict[str, Any] = {
    "_||_": _or,
    "_&&_": _and,
    # Kubernetes' quantity library
    "quantity": _quantity,
    "isQuantity": lambda s: celtypes.BoolType(_is(_strict_quantity, s)),
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "asInteger": _as_integer,
    "isInteger": lambda q: celtypes.BoolType(q.value == q.value.to_integral_value()),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "add": lambda a, b: Quantity(a.value + (b.value if isinstance(b, Quantity) else Decimal(b))),
    "sub": lambda a, b: Quantity(a.value - (b.value if isinstance(b, Quantity) else Decimal(b))),
    # Kubernetes' semver library
    "semver": _semver,
    "isSemver": lambda s: celtypes.BoolType(_is(Semver, s)),
    "major": lambda v: celtypes.IntType(v.parts[0]),
    "minor": lambda v: celtypes.IntType(v.parts[1]),
    "patch": lambda v: celtypes.IntType(v.parts[2]),
    # cel-go ext.Strings, which Kubernetes enables
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "replace": lambda s, a, b: celtypes.StringType(str(s).replace(str(a), str(b))),
    "split": lambda s, sep: celtypes.ListType([celtypes.StringType(p) for p in str(s).split(sep)]),
    "indexOf": lambda s, sub: celtypes.IntType(str(s).find(str(sub))),
    "lastIndexOf": lambda s, sub: celtypes.IntType(str(s).rfind(str(sub))),
}


def _is(make: Any, text: Any) -> bool:
    try:
        make(str(text))
    except (ValueError, TypeError, ArithmeticError):
        return False
    return True


_ENV = celpy.Environment()


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Any:
    """A runnable program for one expression (compiled once: selectors repeat)."""
    try:
        ast = _ENV.compile(expression)
    except celpy.CELParseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise CelError(f"compilation failed: {first}") from None
    return _ENV.program(ast, functions=FUNCTIONS)


def _attribute(value: Mapping[str, Any]) -> Any:
    if "int" in value:
        return celtypes.IntType(int(value["int"]))
    if "bool" in value:
        return celtypes.BoolType(bool(value["bool"]))
    if "version" in value:
        return Semver(value["version"])
    if "string" in value:
        return celtypes.StringType(str(value["string"]))
    return celtypes.ListType([])  # list attributes (alpha): not modelled


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, _, short = name.rpartition("/")
    return (domain or driver), short


def device_activation(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The `device` variable for one device of a slice (compile.go buildVars)."""
    attributes: dict[Any, Any] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, short = _split(name, driver)
        attributes.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(short)] = (
            _attribute(value)
        )
    capacity: dict[Any, Any] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, short = _split(name, driver)
        capacity.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(short)] = Quantity(
            parse_quantity(value.get("value", "0"))
        )
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(driver),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                    bool(device.get("allowMultipleAllocations"))
                ),
                celtypes.StringType("attributes"): celtypes.MapType(
                    {k: celtypes.MapType(v) for k, v in attributes.items()}
                ),
                celtypes.StringType("capacity"): celtypes.MapType(
                    {k: celtypes.MapType(v) for k, v in capacity.items()}
                ),
            }
        )
    }


def matches(expression: str, activation: Mapping[str, Any]) -> bool:
    """Whether the selector is true for the device; CelError when it cannot say (a missing
    attribute, a result that is not a bool)."""
    program = compile_selector(expression)
    try:
        result = program.evaluate(dict(activation))
    except Exception as exc:  # celpy raises CELEvalError, or the function's own error
        raise CelError(f"CEL runtime error: {_short(exc)}") from None
    if isinstance(result, celpy.CELEvalError):
        raise CelError(f"CEL runtime error: {_short(result)}")
    if not isinstance(result, (bool, celtypes.BoolType)):
        raise CelError("CEL result is not a bool")
    return bool(result)


def _short(exc: BaseException) -> str:
    """cel-python's message, worded as cel-go's where they differ (what a cluster prints)."""
    args = getattr(exc, "args", ())
    text = str(args[0]) if args else str(exc)
    missing = re.match(r"no such member in mapping: '(.*)'$", text)
    if missing:
        return f"no such key: {missing.group(1)}"
    return text
