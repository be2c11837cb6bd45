#!/usr/bin/env python3
"""Usage: check_config.py CONFIG.yml

Fast check, before anything is submitted, of a model config and of the MaxText overrides the
job will pass (the newline-separated key=value lines in the TRAIN_OVERRIDES environment variable;
values are never read from the command line, where other users could see them in `ps`).

Every key of the config and of the overrides must be one MaxText accepts and every value of a
type it accepts, judged against requirements/maxtext-schema.json (MaxText's own pydantic config
model, written by utils/dev/maxtext_schema.py), with values read the way MaxText reads them (YAML
scalars: true, 1e-4, [1, 2], none ...). An override of a key that the MaxText model preset also
sets is refused as MaxText would refuse it, unless override_model_config=true.

Prints one line on stderr and exits 1 when something is wrong; values of keys that hold
credentials (hf_access_token, ...) are never shown. Takes well under 0.1 s: it does not import
MaxText. (The full check through MaxText's own parser is tests/test_configs.py.)
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA_PATH = os.path.join(REPO, "requirements", "maxtext-schema.json")
ENV_NAME = "TRAIN_OVERRIDES"

# Besides the schema's secret_keys (MaxText's own list): key names whose values are never shown.
SECRET_NAME = re.compile(
    r"(^|_)(token|access_token|auth|secret|password|passwd|credentials?|api_key|access_key|private_key)($|_)", re.I
)

# Value rewrites MaxText's config loader (maxtext/configs/pyconfig.py) makes before its pydantic
# model sees the value; tests/test_overrides.py compares the outcome with the loader's own.
LIST_FROM_STRING = {"train_data_columns", "eval_data_columns", "trainable_parameters_mask", "adamw_mask"}
EMPTY_IS_NONE = {"hf_train_files", "hf_eval_files", "hf_access_token", "hf_name", "hf_data_dir", "hf_eval_split"}
NONE_IS_EMPTY = {"run_name", "dump_hlo_local_module_name", "dump_hlo_module_name"}
FILLED_WHEN_EMPTY = {"base_output_directory"}  # the loader puts a default in when it is empty

_BOOL_WORDS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}
_INT_TEXT = re.compile(r"[-+]?[0-9]+(_[0-9]+)*(\.0+)?")
_FLOAT_TEXT = re.compile(
    r"[-+]?(([0-9]+(_[0-9]+)*(\.([0-9]+(_[0-9]+)*)?)?|\.[0-9]+(_[0-9]+)*)([eE][-+]?[0-9]+)?|inf|infinity|nan)", re.I
)


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as MaxText's OmegaConf reads a config file or a key=value value: YAML 1.1 scalars,
    plus 1e-4-style floats, no timestamps, duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?: [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
               | [-+]?[0-9]+(?:_[0-9]+)*[eE][-+]?[0-9]+
               | \.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
               | [-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
               | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN) )$""",
        re.X,
    ),
    list("-+0123456789."),
)


class ConfigError(Exception):
    """One line saying what is wrong and what would be right."""


def parse_value(text: str) -> Any:
    """A key=value value as MaxText's loader reads it (raises yaml.YAMLError)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def load_schema(path: str = SCHEMA_PATH) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cannot read MaxText's key list {path} ({getattr(e, 'strerror', None) or e}); "
            "regenerate it with .venv/bin/python utils/dev/maxtext_schema.py"
        ) from None


# --------------------------------------------------------------------------------------------
# Types: does a value pass MaxText's pydantic model (lax mode, the default)?
# --------------------------------------------------------------------------------------------


def _number(value: Any, integer: bool) -> float | int | None:
    """The number pydantic makes of value for an int (integer=True) or float field, else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not integer:
            return value
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        if integer:
            return int(text.partition(".")[0].replace("_", "")) if _INT_TEXT.fullmatch(text) else None
        return float(text.replace("_", "")) if _FLOAT_TEXT.fullmatch(text) else None
    return None


def _bounded(number: float, t: dict[str, Any]) -> bool:
    return (
        ("gt" not in t or number > t["gt"])
        and ("ge" not in t or number >= t["ge"])
        and ("lt" not in t or number < t["lt"])
        and ("le" not in t or number <= t["le"])
    )


def accepts(t: Any, value: Any) -> bool:
    """True when a value of this schema type passes MaxText's pydantic validation."""
    kind = t if isinstance(t, str) else t["kind"]
    if kind == "any":
        return True
    if kind == "none":
        return value is None
    if kind == "bool":
        if isinstance(value, bool):
            return True
        if isinstance(value, (int, float)):
            return value in (0, 1)
        return isinstance(value, str) and value.lower() in _BOOL_WORDS
    if kind in ("int", "float"):
        number = _number(value, kind == "int")
        if number is None:
            return False
        return isinstance(t, str) or (not math.isnan(number) and _bounded(number, t))
    if kind == "str":
        return isinstance(value, str)
    if kind == "enum":
        values = t["values"]
        if isinstance(value, str) and value in values:
            return True
        if all(isinstance(v, int) for v in values):  # IntEnum: 1, 1.0, "1", true
            number = _number(value, True)
            return number is not None and number in values
        return False
    if kind == "list":
        if not isinstance(value, list):
            return False
        return isinstance(t, str) or all(accepts(t["items"], v) for v in value)
    if kind == "dict":
        if not isinstance(value, dict):
            return False
        return isinstance(t, str) or all(accepts(t["values"], v) for v in value.values())
    if kind == "union":
        return any(accepts(member, value) for member in t["of"])
    if kind == "model":
        return isinstance(value, dict) and not _model_problem(t, value, "")
    raise ConfigError(f"unknown type {kind!r} in {SCHEMA_PATH}; regenerate it with utils/dev/maxtext_schema.py")


def _model_problem(t: dict[str, Any], value: dict[str, Any], prefix: str) -> str | None:
    """Why a mapping does not fit a nested model (lora, dpo), or None. A key the model does not
    have is refused even where MaxText would drop it without a word (extra="ignore")."""
    fields = t["fields"]
    for sub, subvalue in value.items():
        if sub not in fields:
            why = _unknown(f"{prefix}{sub}", [f"{prefix}{k}" for k in fields])
            return why if t["extra"] == "forbid" else why + " (MaxText would silently ignore it)"
        if not accepts(fields[sub]["type"], subvalue):
            return f"{prefix}{sub} takes {_wanted(fields[sub]['type'])}"
    return None


def _kind(t: Any) -> str:
    return t if isinstance(t, str) else t["kind"]


def _wanted(t: Any) -> str:
    """What a type accepts, in words."""
    kind = _kind(t)
    if kind in ("int", "float"):
        words = "an integer" if kind == "int" else "a number"
        if isinstance(t, dict):
            bounds = [f"{op} {t[k]}" for k, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if k in t]
            words += " " + " and ".join(bounds)
        return words
    if kind == "enum":
        values = [repr(v) if isinstance(v, str) else str(v) for v in t["values"]]
        if len(values) > 12:
            return f"one of {len(values)} names"
        return "one of " + ", ".join(values)
    if kind == "union":
        parts = [_wanted(m) for m in t["of"] if m != "none"]
        return " or ".join(parts) + (" or none" if "none" in t["of"] else "")
    if kind == "list":
        items = _kind(t["items"]) if isinstance(t, dict) else "any"
        plural = {"int": "integers", "float": "numbers", "str": "strings", "bool": "true/false values"}
        return "a list" + (f" of {plural.get(items, items + ' values')}" if items != "any" else "")
    if kind == "model":
        return "a mapping of " + ", ".join(t["fields"])
    return {"bool": "true or false", "str": "a string", "dict": "a mapping"}.get(kind, kind)


def _sample(t: Any) -> str | None:
    """A value of a list or mapping type, written as an override value."""
    kind = _kind(t)
    if kind == "union":
        return next((s for m in t["of"] if (s := _sample(m))), None)
    if kind == "list":
        items = _kind(t["items"]) if isinstance(t, dict) else "any"
        return {"int": "[1, 2]", "float": "[0.5, 1.0]", "str": "[a, b]", "bool": "[true, false]"}.get(items, "[a, 1]")
    if kind == "dict":
        return "{name: value}"
    return None


def _close(word: str, names: list[str], cutoff: float) -> str:
    """' (did you mean 'a' or 'b'?)' for the names closest to word, or ''."""
    import difflib  # only when there is an error to explain

    close = difflib.get_close_matches(word, names, n=3, cutoff=cutoff)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _unknown(key: str, known: Any, nested: dict[str, str] | None = None) -> str:
    """MaxText has no such key, with the closest names (and the nested key of that name)."""
    if nested and key in nested:
        return f"MaxText has no key {key!r} at the top level (did you mean {nested[key]!r}?)"
    return f"MaxText has no key {key!r}{_close(key, [*known, *(nested or {}).values()], 0.75)}"


# --------------------------------------------------------------------------------------------
# Keys and values
# --------------------------------------------------------------------------------------------


def is_secret(key: str, schema: dict[str, Any]) -> bool:
    """A key whose value is a credential: never shown (any part of a dotted key counts)."""
    secret = set(schema.get("secret_keys", ()))
    return any(part in secret or SECRET_NAME.search(part) for part in key.split("."))


def _normalise(key: str, value: Any, fields: dict[str, Any]) -> Any:
    """The value as MaxText's loader hands it to the pydantic model."""
    if key in FILLED_WHEN_EMPTY and not value:
        return fields[key].get("default") or "<default>"
    if isinstance(value, str) and value.lower() == "none":
        value = None
    if key in LIST_FROM_STRING and isinstance(value, str):
        text = value.strip()
        if (text[:1], text[-1:]) in (("[", "]"), ("(", ")")):
            import ast  # only here: it takes a noticeable share of the start-up

            try:
                parsed = ast.literal_eval(text)
                value = list(parsed) if isinstance(parsed, (list, tuple)) else [str(parsed)]
            except (ValueError, SyntaxError):
                value = [value]
        else:
            value = [value]
    if key in EMPTY_IS_NONE and value == "":
        value = None
    if key in NONE_IS_EMPTY and value is None:
        value = ""
    if key == "tokenizer_path" and value in (None, ""):
        value = "<default>"
    for rule in fields[key].get("before", ()):
        if rule == "csv_floats" and isinstance(value, str):
            try:
                value = [float(v) for v in value.split(",")] if value else []
            except ValueError:
                return value  # left as a string: the list type refuses it
    return value


def _example(key: str, t: Any, fields: dict[str, Any], own: dict[str, Any], sep: str) -> str:
    """', e.g. key=value' with a value MaxText accepts: the config's own, the default or a sample."""
    for value in (own.get(key), fields[key].get("default")):
        if value is None or isinstance(value, (dict, list)) or value == "" or not accepts(t, value):
            continue
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        if isinstance(value, str) and parse_value(value) != value:
            shown = repr(value)
        return f", e.g. {key}{sep}{shown}"
    sample = _sample(t)
    return f", e.g. {key}{sep}{sample}" if sample else ""


def key_problem(key: str, fields: dict[str, Any], sep: str = "=") -> str | None:
    """Why MaxText has no top-level key of this (possibly dotted) name, or None."""
    top = key.partition(".")[0]
    if not top or key.endswith(".") or ".." in key:
        return f"{key!r} is not a valid key: write name{sep}value or name.sub{sep}value"
    if top in fields:
        return None
    nested = {
        sub: f"{name}.{sub}"
        for name, entry in fields.items()
        if _kind(entry["type"]) == "model"
        for sub in entry["type"]["fields"]
    }
    return _unknown(top, fields, nested)


_READ_AS = {bool: "true/false", int: "a number", float: "a number", dict: "a mapping", list: "a list"}


def check_value(
    key: str, value: Any, schema: dict[str, Any], own: dict[str, Any], sep: str = "=", raw: str | None = None
) -> str | None:
    """Why MaxText refuses key (possibly dotted) set to value, or None when it accepts it.
    own: the model config's keys (for examples); raw: the value as written (for quoting hints)."""
    fields = schema["fields"]
    top, _, rest = key.partition(".")
    unknown = key_problem(key, fields, sep)
    if unknown:
        return unknown
    if isinstance(value, str) and "${" in value:
        return None  # an OmegaConf interpolation: its type is known only once MaxText resolves it
    if rest:  # a.b.c=v sets {b: {c: v}} inside a
        for part in reversed(rest.split(".")):
            value = {part: value}
    t = fields[top]["type"]
    value = _normalise(top, value, fields)
    if _kind(t) == "model" and isinstance(value, dict):
        return _model_problem(t, value, f"{top}.")
    if accepts(t, value):
        return None
    why = f"{top} takes {_wanted(t)}"
    if rest:
        return why
    members = t["of"] if _kind(t) == "union" else [t]
    kinds = {_kind(m) for m in members}
    secret = is_secret(key, schema)
    if "str" in kinds and (type(value) in _READ_AS or value is None):
        if value is None:
            return why + f"; for an empty string write {top}{sep}''"
        shown = "'...'" if secret or raw is None or "'" in raw else f"'{raw}'"
        return why + f"; YAML reads this value as {_READ_AS[type(value)]}: quote it, {top}{sep}{shown}"
    if value is None and accepts(t, ""):
        return why + f"; for an empty string write {top}{sep}''"
    enum = next((m for m in members if _kind(m) == "enum"), None)
    if enum and isinstance(value, str) and not secret:
        return why + _close(value, [v for v in enum["values"] if isinstance(v, str)], 0.6)
    if kinds != {"str"} and not secret:
        why += _example(top, t, fields, own, sep)
    return why


def _shown(line: str, key: str, schema: dict[str, Any]) -> str:
    if is_secret(key, schema):
        return f"'{key}=<hidden>'"
    return repr(line if len(line) <= 100 else line[:97] + "...")


def _preset_conflict(
    overrides: list[tuple[str, Any, str]], config: dict[str, Any], schema: dict[str, Any]
) -> str | None:
    """MaxText refuses an override of a key its model preset sets (to another value) unless
    override_model_config is true."""
    merged = {**config, **{key: value for key, value, _ in overrides if "." not in key}}
    if merged.get("override_model_config"):
        return None
    model = merged.get("model_name", schema["fields"].get("model_name", {}).get("default", "default"))
    if not isinstance(model, str) or model == "default":
        return None
    preset_path = os.path.join(_presets_dir(), f"{model.replace('-Instruct', '')}.yml")
    try:
        preset = load_yaml(preset_path)
    except (OSError, yaml.YAMLError):
        return None  # MaxText goes on without a preset it cannot find
    if not isinstance(preset, dict):
        return None
    for key, value, line in overrides:
        top = key.partition(".")[0]
        if top in preset and (value != preset[top] or "." in key):
            shown = "<hidden>" if is_secret(key, schema) else repr(preset[top])
            return (
                f"bad override {_shown(line, key, schema)}: MaxText's preset for model {model} sets "
                f"{top}: {shown}, and MaxText refuses to override a preset key; add override_model_config=true"
            )
    return None


def _presets_dir() -> str:
    """maxtext/configs/models of the installed MaxText, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("maxtext")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return os.path.join(roots[0] if roots else "/nonexistent", "configs", "models")


# Keys _train.sh puts on MaxText's command line before the user's overrides.
LAUNCHER_KEYS = ("run_name", "base_output_directory", "jax_cache_dir")
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def _interpolation_problem(value: Any, cli_keys: set[str]) -> str | None:
    """MaxText resolves the command-line overrides on their own first: an interpolation such as
    ${steps} in an override must name a key that another override sets (resolvers such as
    ${oc.env:NAME} need nothing)."""
    for text in _strings(value):
        if "${" not in text:
            continue
        if "${" in _INTERPOLATION.sub("", text):
            return "the value has an unfinished or nested OmegaConf interpolation '${...}'; write the value itself"
        for ref in _INTERPOLATION.findall(text):
            name = ref.strip().split(".")[0].split("[")[0]
            if ":" not in ref and name not in cli_keys:
                return (
                    f"MaxText resolves ${{{ref}}} among the command-line overrides alone and none of them "
                    f"sets {name}; write the value itself"
                )
    return None


def check_overrides(text: str, config: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why MaxText would refuse the newline-separated key=value overrides, or None."""
    problems: list[str] = []
    parsed: list[tuple[str, Any, str]] = []
    lines = [line for line in text.split("\n") if line]
    cli_keys = {*LAUNCHER_KEYS, *(line.partition("=")[0].partition(".")[0] for line in lines)}
    for line in lines:
        key, eq, raw = line.partition("=")
        if not eq:
            problems.append(f"bad override {line[:100]!r}: write key=value")
            continue
        try:
            value = parse_value(raw)
        except yaml.YAMLError as e:
            what = getattr(e, "problem", None) or str(e).splitlines()[0]  # may quote part of the value
            unknown = key_problem(key, schema["fields"])
            if unknown:
                problems.append(f"bad override {_shown(line, key, schema)}: {unknown}")
                continue
            if is_secret(key, schema):
                problems.append(f"bad override {_shown(line, key, schema)}: the value is not valid YAML")
                continue
            takes_str = check_value(key, "", schema, config) is None
            fix = f"; quote it: {key}='{raw}'" if takes_str and "'" not in raw else ""
            problems.append(f"bad override {_shown(line, key, schema)}: the value is not valid YAML ({what}){fix}")
            continue
        why = key_problem(key, schema["fields"]) or _interpolation_problem(value, cli_keys)
        why = why or check_value(key, value, schema, config, raw=raw)
        if why:
            problems.append(f"bad override {_shown(line, key, schema)}: {why}")
        else:
            parsed.append((key, value, line))
    if not problems:
        conflict = _preset_conflict(parsed, config, schema)
        if conflict:
            problems.append(conflict)
    if not problems:
        return None
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more bad override{'s' if more > 1 else ''})" if more else "")


def check_config_keys(path: str, config: dict[str, Any], schema: dict[str, Any]) -> str | None:
    for key, value in config.items():
        if not isinstance(key, str):
            return f"{path}: key {key!r} is not a name"
        why = check_value(key, value, schema, config, sep=": ")
        if why:
            shown = "<hidden>" if is_secret(key, schema) else json.dumps(value)
            return f"{path} sets {key}: {shown[:80]}, but {why}"
    return None


def check(path: str, overrides: str = "", schema_path: str = SCHEMA_PATH) -> str | None:
    """None when the config and overrides are usable, else a one-line reason (without the
    'bad config:' prefix for config problems; override problems start with 'bad override')."""
    try:
        data = load_yaml(path)
    except OSError as e:
        return f"bad config: cannot read {path}: {e.strerror}"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        return f"bad config: {path} is not valid YAML{where}: {problem}"
    if not isinstance(data, dict):
        return f"bad config: {path} must be a YAML mapping of MaxText keys (key: value), got {type(data).__name__}"
    if "base_config" not in data:
        return f'bad config: {path} has no base_config; add base_config: "base.yml"'
    try:
        schema = load_schema(schema_path)
        why = check_config_keys(path, data, schema)
        if why:
            return f"bad config: {why}"
        return check_overrides(overrides, data, schema)
    except ConfigError as e:
        return f"bad config: {e}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 else 2
    reason = check(argv[1], os.environ.get(ENV_NAME, ""))
    if reason:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
