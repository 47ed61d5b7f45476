"""How a rejected input is explained: each bad field by name (and by the CLI option that set it), the value
it was given, what was wrong and what is allowed.

The allowed range is read from the model's own JSON schema, so `--help`, the CLI's error and the message a
search started from the Temporal UI fails with all state the bounds the pydantic model enforces; a bound is
written down once, in the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError

_VALUE_CHARS = 80  # a pasted megabyte of text is named by its start, not echoed whole


def allowed(model: type[BaseModel], path: str) -> str:
    """What the field at ``path`` (dotted: ``budget.max_wall_minutes``) accepts, in words: ``an integer
    from 1 to 10000``; empty when the schema states no constraint."""
    return _describe(_node_at(_schema(model), tuple(path.split("."))))


def explain(error: ValidationError, model: type[BaseModel], labels: Mapping[str, str] | None = None) -> str:
    """One line per problem in ``error``: ``--max-minutes (budget.max_wall_minutes) = inf: Input should be a
    finite number; allowed: a number more than 0 and at most 10080``. ``labels`` maps a dotted field path to
    the option the user typed, so the message names what they can change."""
    labels = labels or {}
    schema = _schema(model)
    lines = []
    for problem in error.errors(include_url=False):
        loc = tuple(problem["loc"])
        path = ".".join(str(part) for part in loc)
        option = labels.get(".".join(str(part) for part in loc if not isinstance(part, int)))
        if option and option.lstrip("-").replace("-", "_") != path:
            field = f"{option} ({path})"  # both: the option to change, and the field in --spec or the UI
        else:
            field = option or path or "the input"
        if problem["type"] == "missing":
            lines.append(f"{field}: required but missing")
            continue
        message = problem["msg"].removeprefix("Value error, ")
        line = f"{field} = {_shown(problem['input'])}: {message}"
        if problem["type"] == "value_error":
            pass  # a validator of our own: its message already says what is allowed
        elif problem["type"] == "extra_forbidden":
            known = sorted(_node_at(schema, loc[:-1]).get("properties", {}))
            line += f"; known fields here: {', '.join(known)}"
        elif not loc and problem["type"] in ("model_type", "dict_type", "model_attributes_type"):
            line += '; pass a JSON object such as {"problem": "softmax"}'
        else:
            what = _describe(_node_at(schema, loc))
            if what:
                line += f"; allowed: {what}"
        lines.append(line)
    return "\n".join(lines)


@cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _node_at(schema: dict[str, Any], loc: Sequence[Any]) -> dict[str, Any]:
    defs = schema.get("$defs", {})
    node = _resolved(schema, defs)
    for part in loc:
        if isinstance(part, int):  # an item of a list
            node = _resolved(node.get("items", {}), defs)
        else:
            node = _resolved(node.get("properties", {}).get(part, {}), defs)
    return node


def _resolved(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    # Optional fields are `anyOf [X, null]` and nested models are `$ref`s: the constraints live in X.
    while True:
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        elif "anyOf" in node:
            branches = [b for b in node["anyOf"] if b.get("type") != "null"]
            node = branches[0] if len(branches) == 1 else {}
        else:
            return node


def _describe(node: dict[str, Any]) -> str:
    kind = node.get("type")
    if "enum" in node:
        return "one of " + ", ".join(str(v) for v in node["enum"])
    if "const" in node:
        return repr(node["const"])
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a finite number"
        return " ".join([noun, *_numeric_range(node)])
    if kind == "string":
        parts = ["text"]
        low, high = node.get("minLength"), node.get("maxLength")
        if high is not None:
            parts.append(f"of {low} to {high} characters" if low else f"of at most {high} characters")
        elif low:
            parts.append(f"of at least {low} characters")
        if "pattern" in node:  # a pattern is explained by its description, where it has one
            parts.append(node.get("description") or f"matching {node['pattern']}")
        return " ".join(parts)
    if kind == "array":
        text = "a list"
        if node.get("maxItems") is not None:
            text += f" of at most {node['maxItems']} items"
        item = _describe(node.get("items", {}))
        return f"{text}, each {item}" if item else text
    return ""


def _numeric_range(node: dict[str, Any]) -> list[str]:
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        return [f"from {_number(low)} to {_number(high)}"]
    clauses = []
    if low is not None:
        clauses.append(f"at least {_number(low)}")
    if node.get("exclusiveMinimum") is not None:
        clauses.append(f"more than {_number(node['exclusiveMinimum'])}")
    if high is not None:
        clauses.append(f"at most {_number(high)}")
    if node.get("exclusiveMaximum") is not None:
        clauses.append(f"less than {_number(node['exclusiveMaximum'])}")
    return [" and ".join(clauses)] if clauses else []


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"
