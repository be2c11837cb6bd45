"""Each tool's options are declared once (cli.Option in the tool's OPTIONS) and the command line and
the MCP server agree on them (docs/mcp.md "Tools").

For every MCP tool that is a command (triage, diagnose, verify, perf, investigate), the command's argparse
parser (its build_parser()) is compared with the input schema the MCP server publishes: the same
names (an option on one side only fails, unless its declaration says why the MCP tool leaves it out),
the same default, the same choices, the same values accepted and refused at and around the bounds,
and the help line starting with the MCP description. The comparison also runs on a parser and a
schema with one option added by hand, which it must report. The tools' Python APIs (which the MCP
server and job_log_excerpt call) take the declared defaults.
"""

import argparse
import copy
import dataclasses
import inspect
import math
from typing import Any

import anyio
import jsonschema
import pytest

from diagnosis import cli, verify
from diagnosis import diagnose as diag
from diagnosis import investigate as inv
from diagnosis import perf as perf_tool
from diagnosis import triage as tri
from mcpserver import config

TOOLS = {"triage": tri, "diagnose": diag, "verify": verify, "perf": perf_tool, "investigate": inv}
NUMBERS = (-1, 0, 0.5, 1, 1.5, 2, 3, 199, 200, 1e9, math.inf, math.nan)


@pytest.fixture(scope="module")
def schemas(tmp_path_factory) -> dict[str, dict]:
    """The input schema of each MCP tool, as the server lists it."""
    from mcpserver import server  # the MCP SDK: imported by the tests that use it, not at collection

    s = server.build(tmp_path_factory.mktemp("ws"), config.Config())
    return {t.name: t.input_schema for t in anyio.run(s.list_tools)}


def cli_options(ap: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in ap._actions if a.option_strings and not isinstance(a, argparse._HelpAction)}


def cli_accepts(action: argparse.Action, text: str) -> bool:
    try:
        (action.type or str)(text)
    except (argparse.ArgumentTypeError, ValueError):
        return False
    return not action.choices or text in action.choices


def mcp_accepts(schema: dict, name: str, value: Any) -> bool:
    try:
        jsonschema.validate({"job": "1", name: value}, schema)
    except jsonschema.ValidationError:
        return False
    return not (isinstance(value, float) and not math.isfinite(value))  # JSON has no inf or nan


def probes(action: argparse.Action, prop: dict) -> list[Any]:
    kinds = {prop.get("type")} | {p.get("type") for p in prop.get("anyOf", [])}
    if "integer" in kinds:
        return [x for x in NUMBERS if isinstance(x, int)] + [1.5]
    if "number" in kinds:
        return list(NUMBERS)
    return [*(action.choices or ()), "auto", "H100", "no-such-value"]


def differences(module: Any, ap: argparse.ArgumentParser, schema: dict) -> list[str]:
    """Where the command line (parser AP) and the MCP tool (input SCHEMA) of MODULE disagree."""
    declared = {o.name: o for o in module.OPTIONS}
    flags = cli_options(ap)
    props = {k: v for k, v in schema["properties"].items() if k != "job"}
    out = [f"--{n.replace('_', '-')}: on the command line, not declared in OPTIONS" for n in flags.keys() - declared]
    out += [f"{n}: in the MCP tool, not declared in OPTIONS" for n in props.keys() - declared]
    for name, o in declared.items():
        if name not in flags:
            out.append(f"{o.flag}: declared, not on the command line")
        if o.cli_only:
            if name in props:
                out.append(f"{name}: declared cli_only ({o.cli_only}) but in the MCP tool")
            continue
        if name not in props:
            out.append(f"{name}: declared for MCP, not in the MCP tool")
            continue
        action, prop = flags[name], props[name]
        if action.default != prop.get("default"):
            out.append(f"{name}: default {action.default!r} on the command line, {prop.get('default')!r} over MCP")
        enum = prop.get("enum") or next((p["enum"] for p in prop.get("anyOf", []) if "enum" in p), None)
        if tuple(action.choices or ()) != tuple(enum or ()):
            out.append(f"{name}: choices {action.choices} on the command line, {enum} over MCP")
        if not (action.help or "").startswith(prop.get("description", "")):
            out.append(f"{name}: help {action.help!r} does not start with the MCP description")
        for x in probes(action, prop):
            c, m = cli_accepts(action, str(x)), mcp_accepts(schema, name, x)
            if c != m:
                out.append(f"{name}={x!r}: {'accepted' if c else 'refused'} on the command line, not over MCP")
    return out


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_command_line_and_the_mcp_tool_take_the_same_options(schemas, tool):
    module = TOOLS[tool]
    assert schemas[tool]["required"] == ["job"]
    assert differences(module, module.build_parser(), schemas[tool]) == []
    assert all(o.cli_only.strip() for o in module.OPTIONS if o.cli_only != "")  # a reason, not blanks


def test_an_option_added_on_one_side_only_is_found(schemas):
    ap = tri.build_parser()
    ap.add_argument("--max-hosts", type=int, default=8)
    assert differences(tri, ap, schemas["triage"]) == ["--max-hosts: on the command line, not declared in OPTIONS"]
    schema = copy.deepcopy(schemas["perf"])
    schema["properties"]["max_hosts"] = {"type": "integer", "default": 8}
    schema["properties"]["top"] = {"type": "integer", "default": 10}
    assert differences(perf_tool, perf_tool.build_parser(), schema) == [
        "max_hosts: in the MCP tool, not declared in OPTIONS",
        "top: declared cli_only (not offered over MCP yet) but in the MCP tool",
    ]
    schema = copy.deepcopy(schemas["triage"])
    schema["properties"]["hang_factor"]["minimum"] = 2  # a bound changed on one side
    assert differences(tri, tri.build_parser(), schema) == [
        "hang_factor=1: accepted on the command line, not over MCP",
        "hang_factor=1.5: accepted on the command line, not over MCP",
    ]


def test_the_python_apis_take_the_declared_defaults():
    """What the MCP server calls (and job_log_excerpt's triage, with no options) defaults as declared."""
    api = {
        "triage": {f.name: f.default for f in dataclasses.fields(tri.Options)},
        "perf": {n: p.default for n, p in inspect.signature(perf_tool.perf).parameters.items()},
        "investigate": {n: p.default for n, p in inspect.signature(inv.investigate).parameters.items()},
    }
    checked = 0
    for tool, defaults in api.items():
        for o in TOOLS[tool].OPTIONS:
            if o.name in defaults:
                assert defaults[o.name] == o.default, (tool, o.name)
                checked += 1
    assert checked >= 10


def test_options_of_one_group_exclude_each_other_on_both_sides(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        perf_tool.build_parser().parse_args(["1", "--gpu", "H100", "--peak-tflops", "900"])
    assert e.value.code == cli.BAD_INPUT
    assert "not allowed with argument" in capsys.readouterr().err
    from mcp.server.mcpserver.exceptions import ToolError

    from mcpserver import server

    s = server.build(tmp_path, config.Config())
    with pytest.raises(ToolError, match=r"perf\.py: give peak_tflops or gpu, not both$"):
        anyio.run(s.call_tool, "perf", {"job": "1", "gpu": "H100", "peak_tflops": 900})


def test_the_help_line_ends_with_the_default():
    assert cli.Option("n", "how many", int, 3, ge=0).cli_help() == "how many (default 3)"
    assert cli.Option("x", "a share", float, 0.1, note="default 0.10").cli_help() == "a share (default 0.10)"
    assert cli.Option("m", "mode", default="auto", choices=("auto", "never")).cli_help() == "mode"
    assert cli.Option("k", "odd", int, ge=0, le=10).bounds() == "0 .. 10"
    assert cli.Option("p", "positive", float, gt=0).bounds() == "a positive number"
