"""Config errors: every problem as ``path: message`` (docs/configuration.md, "Errors").

Pydantic reports type errors at a location (``("collections", 0, "epsilon")``); the semantic
validators of :mod:`ldpstream.config` raise :func:`problems`, one error carrying several
``(suffix, message)`` pairs below its location (``[1]``, ``.csv.path``). :func:`format_errors`
turns both into lines that start with the offending field, type errors before semantic ones.
"""
from __future__ import annotations

import math
import typing
from typing import Any, Mapping, NoReturn, Sequence

from pydantic import BaseModel
from pydantic_core import PydanticCustomError

from ldpstream.errors import CliError
from ldpstream.suggest import did_you_mean

__all__ = ["ConfigError", "problems", "format_errors", "SEMANTIC"]

#: the pydantic error type of :func:`problems`
SEMANTIC = "ldp_semantic"


class ConfigError(CliError, ValueError):
    """An invalid config. ``errors`` lists every problem found, each starting with its field
    path; ``str()`` is the first (and a count of the others) on one line."""

    def __init__(self, errors: str | Sequence[str]) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        msg = self.errors[0]
        if len(self.errors) > 1:
            msg += f" (and {len(self.errors) - 1} more: " + "; ".join(self.errors[1:4]) + \
                ("; ..." if len(self.errors) > 4 else "") + ")"
        super().__init__(msg)


def problems(*items: tuple[str, str]) -> NoReturn:
    """Fail a validator with one or more ``(suffix, message)``: ``suffix`` is appended to the
    validated field's path (``""``, ``"[2]"``, ``".csv.path"``)."""
    raise PydanticCustomError(SEMANTIC, "{summary}",
                              {"summary": "; ".join(m for _, m in items), "items": list(items)})


def format_errors(errors: Sequence[Mapping[str, Any]], root: type[BaseModel]) -> list[str]:
    """Pydantic errors of a ``root`` validation as ``path: message`` lines: the errors outside
    ``collections[i]`` first, then per collection its type errors, then its semantic ones."""
    def order(e: Mapping[str, Any]) -> tuple[int, int, int]:
        loc = tuple(e.get("loc", ()))
        in_coll = len(loc) >= 2 and loc[0] == "collections" and isinstance(loc[1], int)
        return (int(in_coll), loc[1] if in_coll else -1, int(e.get("type") == SEMANTIC))

    out: list[str] = []
    for e in sorted(errors, key=order):
        out.extend(_format_error(e, root))
    return out


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _allowed_at(root: type[BaseModel], loc: Sequence[Any]) -> str:
    """The field names of the model at ``loc`` (for "unknown field" errors)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field_ = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = None if field_ is None else _model_in(field_.annotation)
    if model is None:
        return "?"
    return ", ".join(f.alias or n for n, f in model.model_fields.items())


def _model_in(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def got(v: Any) -> str:
    """A value as the messages quote it: whole floats without ``.0``, strings with quotes."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return str(int(v))
    return repr(v) if isinstance(v, str) else str(v)


_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}
_KINDS = {
    ("float_type", "float_parsing", "finite_number"): "must be a finite number",
    ("int_type", "int_parsing", "int_from_float"): "must be an integer",
    ("bool_type", "bool_parsing"): "must be true or false",
    ("string_type",): "must be a string",
    ("list_type", "tuple_type"): "must be a list",
    ("dict_type", "model_type", "model_attributes_type"): "must be a mapping",
}


def _format_error(e: Mapping[str, Any], root: type[BaseModel]) -> list[str]:
    loc = list(e.get("loc", ()))
    typ = e.get("type", "")
    ctx = e.get("ctx") or {}
    inp = e.get("input")
    where = _loc(loc)
    if typ == SEMANTIC:
        return [f"{where}{sfx}: {msg}" for sfx, msg in ctx["items"]]
    if typ == "extra_forbidden":
        allowed = _allowed_at(root, loc[:-1])
        return [f"{where}: unknown field (allowed: {allowed})"
                f"{did_you_mean(loc[-1], allowed.split(', '))}"]
    if typ == "missing":
        return [f"{where}: required field missing"]
    if typ in _BOUNDS:
        op, key = _BOUNDS[typ]
        bound = ctx.get(key)
        kind = "a number" if isinstance(bound, float) else "an integer"
        return [f"{where}: must be {kind} {op} {got(bound)} (got {got(inp)})"]
    for types, text in _KINDS.items():
        if typ in types:
            return [f"{where}: {text} (got {got(inp)})"]
    if typ == "literal_error":
        return [f"{where}: must be one of {ctx.get('expected')} (got {got(inp)})"]
    if typ == "too_short":
        return [f"{where}: must not be empty"]
    msg = str(e.get("msg", "invalid"))
    return [f"{where}: {msg[0].lower() + msg[1:] if msg else 'invalid'}"]
