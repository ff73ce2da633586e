"""A framework task's arguments and return value as JSON, and what is said when they are not.

The framework normalizes both with its `normalize_json` (tuples become lists)
and raises its TypeError (or ValueError) for anything else; this keeps those
classes and that message, as its own backends do, and adds after it the sentence
`jsoncodec.describe_unencodable` words, the same `enqueue` gives for a payload:
which argument, and what to pass instead.
"""

from __future__ import annotations

from typing import Any, cast

from .. import compat, jsoncodec


def json_arguments(task: Any, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) normalized to JSON the framework's way; raise naming a bad argument."""
    args, kwargs = list(args), dict(kwargs)
    try:
        # normalize_json keeps a list a list and a dict a dict; the stubs type it wider.
        return (
            cast("list[Any]", compat.normalize_json(args)),
            cast("dict[str, Any]", compat.normalize_json(kwargs)),
        )
    except (TypeError, ValueError) as exc:
        problem = arguments_problem(task, args, kwargs)
        # Django's own words first ("Unsupported type: <class 'datetime.datetime'>"), as its
        # backends and the tests written against them say; then which argument, and what instead.
        raise type(exc)(f"{exc}. {problem}" if problem else str(exc)) from exc


def arguments_problem(task: Any, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The sentence for the first argument of a call that is not storable JSON, or None."""
    closing = jsoncodec.JSON_ONLY.format(what="Arguments")
    # Keyword names are strings already: Python allows no others.
    for root, value, framework in (
        (_positional, args, True), (_keyword, kwargs, True),
        # What normalize_json lets through but the queue cannot store (NaN).
        (_positional, args, False), (_keyword, kwargs, False),
    ):
        problem = jsoncodec.describe_unencodable(value, root, closing, framework=framework)
        if problem is not None:
            return f"The arguments of {task.module_path} must be JSON: {problem}"
    return None


def json_return_value(task: Any, value: Any) -> Any:
    """The task's return value normalized to JSON; raise TypeError/ValueError if it is not."""
    try:
        return compat.normalize_json(value)
    except (TypeError, ValueError) as exc:
        problem = jsoncodec.describe_unencodable(
            value, jsoncodec.subscripts("the return value"),
            jsoncodec.JSON_ONLY.format(what="It"), framework=True,
        )
        message = f"{exc}. {task.module_path} returned a value that cannot be stored as JSON"
        raise type(exc)(f"{message}: {problem}" if problem else f"{message}.") from exc


def _positional(path: tuple[Any, ...]) -> str:
    return _argument(f"positional argument {path[0]}", path)


def _keyword(path: tuple[Any, ...]) -> str:
    return _argument(f"keyword argument {path[0]!r}", path)


def _argument(argument: str, path: tuple[Any, ...]) -> str:
    inner = "".join(f"[{step!r}]" for step in path[1:])
    return f"{argument} (at {inner})" if inner else argument
