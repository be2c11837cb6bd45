#!/usr/bin/env python3
"""Usage: maxtext_schema.py [--check [FILE]] [--help]

Writes requirements/maxtext-schema.json: the keys MaxText accepts in a config or as a
key=value override, with their types, read from the installed MaxText's own pydantic model
(maxtext.configs.types.MaxTextConfig). utils/launch/check_config.py judges overrides against this
file at submit time without importing MaxText (which takes seconds: it imports JAX).

Run it with the project's venv Python after changing the MaxText pin:
  .venv/bin/python utils/dev/maxtext_schema.py
  --check [FILE]  write nothing; exit 1 (with a one-line reason) when the file (default: the one
                 above) differs from what the installed MaxText gives (tests/test_overrides.py)
"""

from __future__ import annotations

import enum
import json
import re
import runpy
import sys
import types
import typing
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "entry.py"))["enter_venv"]()

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "requirements" / "maxtext-schema.json"

# Field validators of MaxTextConfig that run before the type check, by function name, and the
# rule check_config.py applies for them. A validator not listed here fails the generation, so
# a MaxText upgrade that adds one is noticed.
BEFORE_VALIDATORS = {"_clean_empty_string_for_list": "csv_floats"}

# Names that hold credentials besides those MaxText itself keeps out of its logs
# (pyconfig.KEYS_NO_LOGGING).
SECRET_NAME = re.compile(r"(^|_)(access_token|auth_token|secret|password|passwd|credentials?|api_key)($|_)")

SIMPLE = {bool: "bool", int: "int", float: "float", str: "str", dict: "dict", list: "list"}


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metadata:
        for attr in ("gt", "ge", "lt", "le"):
            value = getattr(m, attr, None)
            if value is not None:
                out[attr] = value
        if type(m).__name__ not in ("Gt", "Ge", "Lt", "Le", "Strict") or getattr(m, "strict", False):
            raise TypeError(f"unsupported constraint {m!r}")
    return out


def describe(annotation: Any, metadata: list[Any] | None = None) -> Any:
    """The JSON type description of a pydantic field annotation (see check_config.py)."""
    from pydantic import BaseModel

    metadata = list(metadata or [])
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return describe(args[0], [*metadata, *args[1:]])
    if isinstance(annotation, typing.NewType):
        return describe(annotation.__supertype__, metadata)
    limits = _constraints(metadata)
    if origin in (typing.Union, types.UnionType):  # a bound on Optional[int] applies to the int
        return {"kind": "union", "of": [describe(a, metadata if a in (int, float) else None) for a in args]}
    if limits and annotation not in (int, float):
        raise TypeError(f"constraint {limits} on {annotation!r}")
    if annotation is typing.Any:
        return "any"
    if annotation is type(None):
        return "none"
    if annotation in SIMPLE:
        return {"kind": SIMPLE[annotation], **limits} if limits else SIMPLE[annotation]
    if origin is typing.Literal:
        return {"kind": "enum", "values": list(args)}
    if origin is list:
        return {"kind": "list", "items": describe(args[0])} if args else "list"
    if origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"unsupported dict key type in {annotation!r}")
        return "dict" if not args or args[1] is typing.Any else {"kind": "dict", "values": describe(args[1])}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"kind": "enum", "name": annotation.__name__, "values": [m.value for m in annotation]}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {
            "kind": "model",
            "name": annotation.__name__,
            "extra": annotation.model_config.get("extra") or "ignore",
            "fields": fields_of(annotation),
        }
    raise TypeError(f"unsupported annotation {annotation!r}")


def _default(field: Any) -> Any:
    value = field.default
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 80):
        return value
    return ...  # no simple default to show


def fields_of(model: Any) -> dict[str, Any]:
    validators: dict[str, list[str]] = {}
    for dec in model.__pydantic_decorators__.field_validators.values():
        if dec.info.mode != "before":
            raise TypeError(f"unsupported {dec.info.mode} field validator {dec.func.__name__}")
        rule = BEFORE_VALIDATORS.get(dec.func.__name__)
        if rule is None:
            raise TypeError(f"unknown field validator {dec.func.__name__} of {model.__name__}: add its rule")
        for name in dec.info.fields:
            validators.setdefault(name, []).append(rule)
    out: dict[str, Any] = {}
    for name, field in sorted(model.model_fields.items()):
        entry: dict[str, Any] = {"type": describe(field.annotation, field.metadata)}
        default = _default(field)
        if default is not ...:
            entry["default"] = default
        if name in validators:
            entry["before"] = validators[name]
        out[name] = entry
    return out


def build() -> dict[str, Any]:
    import importlib.metadata

    from maxtext.configs import pyconfig
    from maxtext.configs import types as mt_types

    fields = fields_of(mt_types.MaxTextConfig)
    secret = sorted({*pyconfig.KEYS_NO_LOGGING, *(k for k in fields if SECRET_NAME.search(k))})
    return {
        "maxtext": importlib.metadata.version("maxtext"),
        "source": "maxtext.configs.types.MaxTextConfig (regenerate: .venv/bin/python utils/dev/maxtext_schema.py)",
        "extra": mt_types.MaxTextConfig.model_config.get("extra") or "ignore",
        "secret_keys": secret,
        "fields": fields,
    }


def render(schema: dict[str, Any]) -> str:
    """JSON with one field per line, so that a MaxText upgrade reads as a short diff."""
    head = {k: v for k, v in schema.items() if k != "fields"}
    lines = [json.dumps(head)[:-1] + ', "fields": {']
    items = list(schema["fields"].items())
    for i, (name, entry) in enumerate(items):
        lines.append(f"  {json.dumps(name)}: {json.dumps(entry)}{',' if i < len(items) - 1 else ''}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if not (args == [] or (args[0] == "--check" and len(args) <= 2)):
        print(
            f"maxtext_schema.py: unexpected arguments {' '.join(args)!r} (expected --check [FILE] or --help)",
            file=sys.stderr,
        )
        return 2
    import logging

    logging.disable(logging.WARNING)
    try:
        text = render(build())
    except ImportError as e:
        print(
            f"maxtext_schema.py: cannot import MaxText ({e}); run it with the venv's Python: "
            ".venv/bin/python utils/dev/maxtext_schema.py",
            file=sys.stderr,
        )
        return 1
    if not args:
        SCHEMA_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_PATH.relative_to(REPO)} ({len(json.loads(text)['fields'])} keys)")
        return 0
    path = Path(args[1]) if len(args) == 2 else SCHEMA_PATH
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if old == text:
        return 0
    new = json.loads(text)
    try:
        cur = json.loads(old)
    except ValueError:
        cur = {"fields": {}}
    keys = new["fields"].keys() | cur.get("fields", {}).keys()
    changed = sorted(k for k in keys if new["fields"].get(k) != cur.get("fields", {}).get(k))
    print(
        f"{path} is out of date for the installed MaxText {new['maxtext']} ({len(changed)} keys differ"
        f"{', e.g. ' + ', '.join(changed[:5]) if changed else ''}); regenerate it: "
        ".venv/bin/python utils/dev/maxtext_schema.py",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
