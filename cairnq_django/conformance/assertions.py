"""What a conformance step's result must be: `$alias.field` references and assertions.

A step's args and an expect step's target may refer to what earlier steps
saved; `check` holds a value to the scenario's assertions, comparing as JSON
does. Anything it cannot make sense of fails the step rather than passing it.
"""

from __future__ import annotations

import json
import re
from typing import Any

ASSERTIONS = (
    "equals",
    "equalsRef",
    "notEqualsRef",
    "greaterThanRef",
    "length",
    "notNull",
    "isNull",
)

_REFERENCE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)((?:\.[^.]+)*)$")


class StepFailed(Exception):
    """A step did not do what its scenario says."""


# ---------------------------------------------------------------- references
def describe(value: Any) -> str:
    """A value as short JSON, for failure messages."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    elif hasattr(value, "__dataclass_fields__"):
        value = {name: getattr(value, name) for name in value.__dataclass_fields__}
    text = json.dumps(value, default=repr, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 240 else text[:237] + "..."


def field(value: Any, name: str | int) -> Any:
    """Read one field of a result: a dict key, a list index or a record attribute.

    A field of null is null and a dict's missing key is null (stats leaves out
    the queues it has no rows for); a record's unknown field is an error, so a
    misspelt field name cannot make isNull pass.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get(name)
    if isinstance(value, (list, tuple)):
        if isinstance(name, str) and not re.fullmatch(r"-?\d+", name):
            raise StepFailed(f"Cannot read field {name!r} of a list; index it with a number.")
        index = int(name)
        if not -len(value) <= index < len(value):
            raise StepFailed(f"Index {index} is out of range for a list of {len(value)}.")
        return value[index]
    if isinstance(name, str) and not name.startswith("_") and hasattr(value, name):
        return getattr(value, name)
    raise StepFailed(f"{type(value).__name__} has no field {name!r}.")


def resolve(value: Any, saved: dict[str, Any]) -> Any:
    """Replace every `$alias[.field...]` string inside value by what it refers to."""
    if isinstance(value, dict):
        return {key: resolve(item, saved) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, saved) for item in value]
    if not isinstance(value, str) or not value.startswith("$"):
        return value
    match = _REFERENCE.match(value)
    if match is None:
        raise StepFailed(f"{value!r} is not a valid reference; write $alias or $alias.field.")
    alias, path = match.group(1), match.group(2)
    if alias not in saved:
        raise StepFailed(f"Reference {value!r} names {alias!r}, which no earlier step saved.")
    result = saved[alias]
    for part in path.split(".")[1:]:
        result = field(result, part)
    return result


# ---------------------------------------------------------------- comparison
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same(actual: Any, expected: Any) -> bool:
    """Compare like JSON does: true is not 1, 1 is 1.0, containers compare deeply."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if _is_number(expected) or _is_number(actual):
        return _is_number(actual) and _is_number(expected) and actual == expected
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(same(actual[key], expected[key]) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(expected)
            and all(same(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return type(actual) is type(expected) and actual == expected


def _field_names(names: Any, assertion: str) -> list[str]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise StepFailed(f"{assertion} takes a list of field names, got {names!r}.")
    return names


def check(value: Any, assertions: dict[str, Any], saved: dict[str, Any]) -> None:
    """Raise StepFailed unless value meets every assertion."""
    unknown = set(assertions) - set(ASSERTIONS)
    if unknown:
        raise StepFailed(
            f"Unknown assertion {', '.join(sorted(unknown))}; use one of {', '.join(ASSERTIONS)}."
        )
    if "equals" in assertions:
        expected = assertions["equals"]
        if not isinstance(expected, dict):
            raise StepFailed(f"equals takes an object of field values, got {expected!r}.")
        for name, want in expected.items():
            got = field(value, name)
            if not same(got, want):
                raise StepFailed(
                    f"Expected {name} = {describe(want)}, got {describe(got)}"
                    f" in {describe(value)}."
                )
    if "equalsRef" in assertions:
        want = resolve(assertions["equalsRef"], saved)
        if not same(value, want):
            raise StepFailed(f"Expected {describe(want)}, got {describe(value)}.")
    if "notEqualsRef" in assertions:
        other = resolve(assertions["notEqualsRef"], saved)
        if same(value, other):
            raise StepFailed(f"Expected a value other than {describe(other)}.")
    if "greaterThanRef" in assertions:
        bound = resolve(assertions["greaterThanRef"], saved)
        if not (_is_number(value) and _is_number(bound)):
            raise StepFailed(
                f"greaterThanRef compares numbers, got {describe(value)} and {describe(bound)}."
            )
        if not value > bound:
            raise StepFailed(f"Expected a value greater than {bound}, got {value}.")
    if "length" in assertions:
        want = assertions["length"]
        if not isinstance(value, (list, tuple, dict)):
            raise StepFailed(f"Expected a list of length {want}, got {describe(value)}.")
        if len(value) != want:
            raise StepFailed(
                f"Expected length {want}, got {len(value)}: {describe(value)}."
            )
    for name in _field_names(assertions.get("notNull", []), "notNull"):
        if field(value, name) is None:
            raise StepFailed(f"Expected {name} to be set, got null in {describe(value)}.")
    for name in _field_names(assertions.get("isNull", []), "isNull"):
        got = field(value, name)
        if got is not None:
            raise StepFailed(f"Expected {name} to be null, got {describe(got)}.")
