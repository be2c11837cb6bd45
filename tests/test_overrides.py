"""MaxText overrides and config keys are judged at submit time, before anything is started.

utils/launch/check_config.py refuses an unknown key or a value of the wrong type with one line, using
requirements/maxtext-schema.json (MaxText's pydantic model, extracted by utils/dev/maxtext_schema.py)
and without importing MaxText. These tests hold it to MaxText itself:

- the schema file is what the installed MaxText gives (drift fails the test);
- one worker process (this file run as a script with the venv's Python) imports MaxText and
  compares, for every key and a set of values written as a user would write them, the checker's
  verdict with pydantic's validation of that field after MaxText's own loader rewrites
  (pyconfig._prepare_for_pydantic), and the checker's YAML reading with OmegaConf's;
- a set of overrides goes through MaxText's whole config parser (pyconfig.initialize), the way the
  trainer loads it, and the checker must accept exactly what the parser accepts;
- the user-facing command: the message, the exit status, secrets never shown, every config and
  every override shown in the docs accepted.

Run: .venv/bin/python -m pytest tests/test_overrides.py  (about 30 s on 2 cores)
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "utils" / "launch" / "check_config.py"
SCHEMA = REPO / "requirements" / "maxtext-schema.json"
CONFIGS = sorted((REPO / "configs").glob("*.yml"))
TINY = REPO / "configs" / "tiny.yml"
PRESET_CONFIG = REPO / "configs" / "llama3.1-8b.yml"  # a config that loads a MaxText model preset
TIMEOUT_S = 600

# Values as a user writes them after key=, each read by YAML first (quotes make strings).
PROBES = [
    "10", "-1", "0", "1", "2", "+1", "1_000", "0x10", "0o17", "1:30",
    "1.0", "1.5", "-2.0", "1.", ".5", "1e-4", "1e3", "1.0e0", ".inf", "-.inf", ".nan",
    "true", "True", "TRUE", "false", "yes", "no", "on", "off", "y", "n", "t", "f",
    "none", "None", "NONE", "null", "~", "", "abc", "2024-01-01",
    "'10'", "' 10 '", "'+5'", "'-0'", "'01'", "'1_000'", "'1__0'", "'0x10'", "'1.0'", "'1.00'", "'1.'", "'5.5'",
    "'.5'", "'+.5'", "'1e2'", "'1_000.5'", "' 1.5 '", "'inf'", "'-inf'", "'Infinity'", "'nan'", "'-nan'",
    "'true'", "'True'", "'tRuE'", "' true'", "'ON'", "'yes'", "'off'", "'0'", "'2'", "' 1'",
    "''", "'none'", "'1,2'", "'1.5,2'", "'a,b'", "'١'", "'٣.5'",
    "[1,2]", "[]", "[a,b]", "['1','2']", "[1.5]", "[true]", "[1, a]", "[[data, fsdp]]", "'[a, b]'", "'(a)'",
    "{a: 1}", "{}", "a: b",
]  # fmt: skip

# Overrides MaxText's parser accepts, all in one run; and overrides it refuses, one run each.
PARSER_ACCEPTS = [
    (TINY, [
        "steps=7", "learning_rate=1e-4", "enable_checkpointing=yes", "per_device_batch_size=2", "dtype=bfloat16",
        "attention=dot_product", "profiler=xplane", "run_name=", "tokenizer_path=", "base_output_directory=",
        "hf_access_token=", "train_data_columns=text", "ici_parallelism=[1]", "xprof_tpu_power_trace_level='1'",
        "lora.lora_rank=8", "dpo.dpo_beta=0.2", "student_overrides.anything=1", "constant_bound_config='1.0,2.0'",
        "checkpoint_period=1000", "remat_policy=minimal", "eval_interval=-1", "run_name=run-${steps}",
        "hf_data_dir=${oc.env:HOME}",
    ]),
    (PRESET_CONFIG, ["override_model_config=true", "base_num_decoder_layers=4", "steps=3"]),
    (PRESET_CONFIG, ["base_num_decoder_layers=32"]),  # the preset's own value
]  # fmt: skip
PARSER_REFUSES = [
    (TINY, ["stepz=10"]),
    (TINY, ["steps=ten"]),
    (TINY, ["steps=1.5"]),
    (TINY, ["steps=[1"]),
    (TINY, ["run_name=123"]),
    (TINY, ["dtype=bf16"]),
    (TINY, ["enable_checkpointing=maybe"]),
    (TINY, ["lora_rank=8"]),
    (TINY, ["lora.lora_rankk=8"]),
    (TINY, ["steps.x=1"]),
    (TINY, ["profiler="]),
    (TINY, ["ici_parallelism=[1,a]"]),
    (TINY, ["constant_bound_config=a"]),
    (TINY, ["dropout_rate=2"]),
    (TINY, ["log_period=none"]),
    (TINY, ["run_name=${model_name}"]),  # resolved among the command-line overrides alone
    (TINY, ["run_name=${oops"]),
    (PRESET_CONFIG, ["base_num_decoder_layers=4"]),
]


# --------------------------------------------------------------------------------------------
# Worker: runs in its own process with MaxText imported (python tests/test_overrides.py --worker).
# --------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and repr(a) == repr(b)


def _field_models(model: Any) -> dict[str, Any]:
    """One pydantic model per field of model, with that field's annotation, constraints and field
    validators: validates one key as MaxTextConfig does, without its whole-config checks."""
    from pydantic import ConfigDict, create_model, field_validator

    decorators = model.__pydantic_decorators__.field_validators.values()
    out = {}
    for name, field in model.model_fields.items():
        validators = {
            f"v{i}": field_validator(name, mode=dec.info.mode)(lambda cls, v, fn=dec.func: fn(v))
            for i, dec in enumerate(decorators)
            if name in dec.info.fields
        }
        out[name] = create_model(
            f"One_{name}",
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            __validators__=validators,
            **{name: (field.annotation, field)},
        )
    return out


def _enum_probes(t: Any) -> list[str]:
    """Each choice of an enum type, also in capitals, quoted and with a leading space."""
    if not isinstance(t, dict):
        return []
    out = []
    for value in t.get("values", [])[:5]:
        out += [str(value), str(value).upper(), repr(str(value)), f"' {value}'"]
    for member in [*t.get("of", []), t.get("items")]:
        out += _enum_probes(member)
    return out


def _read(load: Any, text: str) -> Any:
    import yaml

    try:
        return load(text)
    except yaml.YAMLError:
        return "<yaml error>"


def _compare_fields(cc: Any, schema: dict[str, Any]) -> dict[str, Any]:
    import yaml
    from maxtext.configs import pyconfig
    from maxtext.configs import types as mt_types
    from omegaconf._yaml import get_yaml_loader
    from pydantic import ValidationError

    loader = get_yaml_loader()
    models = _field_models(mt_types.MaxTextConfig)
    mismatches, loader_diffs, stricter, count = [], [], [], 0
    read: dict[str, tuple[Any, Any]] = {}  # probe text: (as OmegaConf reads it, as the checker reads it)
    os.environ["HF_TOKEN"] = "hf_probe"  # the keys the loader fills in when they are empty
    inferred = set(pyconfig._resolve_or_infer_addl_config())
    del os.environ["HF_TOKEN"]

    def real_accepts(name: str, value: Any) -> bool:
        raw = {name: value}
        if name in inferred:
            raw.update({k: v for k, v in pyconfig._resolve_or_infer_addl_config(**raw).items() if k == name})
        try:
            models[name](**{name: pyconfig._prepare_for_pydantic(raw)[name]})
        except (ValidationError, ValueError, TypeError):
            return False
        return True

    for name, entry in schema["fields"].items():
        t = entry["type"]
        nested = t["fields"] if isinstance(t, dict) and t["kind"] == "model" else {"": {"type": t}}
        for sub, sub_entry in nested.items():
            key = f"{name}.{sub}" if sub else name
            for text in dict.fromkeys(PROBES + _enum_probes(sub_entry["type"])):
                if text not in read:
                    read[text] = (_read(lambda t: yaml.load(t, Loader=loader), text), _read(cc.parse_value, text))
                    if not _same(*read[text]):
                        loader_diffs.append([text, *map(repr, read[text])])
                theirs, mine = read[text]
                if theirs == "<yaml error>":
                    continue
                count += 1
                real = real_accepts(name, {sub: theirs} if sub else theirs)
                why = cc.check_value(key, mine, schema, {})
                if real != (why is None):
                    mismatches.append({"key": key, "value": text, "maxtext_accepts": real, "checker": why})
        if "" not in nested:  # a nested model: a key it does not have
            key = f"{name}.no_such_key"
            real, why = real_accepts(name, {"no_such_key": 1}), cc.check_value(key, 1, schema, {})
            if real and why and why.endswith("(MaxText would silently ignore it)"):
                stricter.append(key)  # MaxText drops the misspelt key without a word: refused on purpose
            elif real != (why is None):
                mismatches.append({"key": key, "value": "1", "maxtext_accepts": real, "checker": why})
    return {"count": count, "mismatches": mismatches, "loader_diffs": loader_diffs, "stricter": sorted(set(stricter))}


def _compare_config_files(cc: Any) -> list[str]:
    """Each configs/*.yml as OmegaConf reads it and as the checker reads it."""
    import omegaconf

    diffs = []
    for path in CONFIGS:
        theirs = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(path))
        mine = cc.load_yaml(str(path))
        if json.dumps(theirs, sort_keys=True) != json.dumps(mine, sort_keys=True):
            diffs.append(path.name)
    return diffs


def _compare_parser(cc: Any) -> list[dict[str, Any]]:
    from maxtext.configs import pyconfig

    out = []
    for config, overrides in PARSER_ACCEPTS + PARSER_REFUSES:
        try:
            pyconfig.initialize(["", str(config), "skip_jax_distributed_system=true", *overrides])
            real = None
        except BaseException as e:  # the error is the result
            if isinstance(e, SystemExit) and e.__context__ is not None:
                e = e.__context__
            real = f"{type(e).__name__}: {str(e)[:300]}"
        out.append(
            {
                "config": config.name,
                "overrides": overrides,
                "maxtext": real,
                "checker": cc.check(str(config), "\n".join(overrides)),
            }
        )
    return out


def worker_main() -> int:
    import logging

    logging.disable(logging.WARNING)
    from launch import check_config as cc

    schema = cc.load_schema()
    results = {
        "fields": _compare_fields(cc, schema),
        "config_files": _compare_config_files(cc),
        "parser": _compare_parser(cc),
    }
    sys.stdout.flush()
    print("\n@@RESULTS@@" + json.dumps(results))
    return 0


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    """No M_<KEY> overrides, HF token or stray JAX settings from the caller's environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("M_", "XLA_", "JAX_", "LIBTPU_", "TPU_")) and k not in ("PYTHONPATH", "HF_TOKEN")
    }
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def maxtext(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    proc = subprocess.run(
        [str(venv / "bin/python"), str(Path(__file__).resolve()), "--worker"],
        capture_output=True,
        text=True,
        cwd=tmp_path_factory.mktemp("overrides"),  # MaxText names a local output directory from it
        env=_clean_env(),
        timeout=TIMEOUT_S,
        check=False,
    )
    marker = "\n@@RESULTS@@"
    assert proc.returncode == 0 and marker in proc.stdout, (
        f"override worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return json.loads(proc.stdout.rsplit(marker, 1)[1])


def check(venv: Path, config: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    """check_config.py as the launcher runs it: overrides in TRAIN_OVERRIDES, never in argv."""
    return subprocess.run(
        [str(venv / "bin/python"), str(CHECK), str(config)],
        capture_output=True,
        text=True,
        env={**_clean_env(), "TRAIN_OVERRIDES": "".join(f"{o}\n" for o in overrides), **env},
        timeout=60,
        check=False,
    )


def refused(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1, f"exit {res.returncode}, expected a refusal: {res.stdout}{res.stderr}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and not res.stdout, f"expected one line on stderr: {res.stdout!r} {res.stderr!r}"
    assert "Traceback" not in res.stderr
    return lines[0]


@pytest.mark.slow
def test_schema_is_that_of_the_installed_maxtext(venv: Path, tmp_path: Path) -> None:
    tool = [str(venv / "bin/python"), str(REPO / "utils/dev/maxtext_schema.py"), "--check"]
    res = subprocess.run(tool, capture_output=True, text=True, env=_clean_env(), timeout=300, check=False)
    assert res.returncode == 0, f"{res.stderr[-2000:]}"
    # The check can fail: a schema that lost a key and changed another one's type.
    data = json.loads(SCHEMA.read_text(encoding="utf-8"))
    del data["fields"]["steps"]
    data["fields"]["dtype"]["type"] = "str"
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(data), encoding="utf-8")
    res = subprocess.run(
        [*tool, str(stale)], capture_output=True, text=True, env=_clean_env(), timeout=300, check=False
    )
    assert res.returncode == 1 and "2 keys differ" in res.stderr and "dtype, steps" in res.stderr, res.stderr


@pytest.mark.slow
def test_checker_agrees_with_pydantic_on_every_key(maxtext: dict[str, Any]) -> None:
    fields = maxtext["fields"]
    assert fields["count"] > 50_000, "the worker compared too few values"
    assert not fields["mismatches"], (
        f"{len(fields['mismatches'])} verdicts differ from MaxText's pydantic model, e.g.:\n"
        + "\n".join(map(json.dumps, fields["mismatches"][:15]))
    )
    # Stricter than MaxText on purpose only where MaxText would drop a misspelt key without a
    # word: dpo's model ignores unknown keys (lora's forbids them).
    assert fields["stricter"] == ["dpo.no_such_key"], fields["stricter"]


@pytest.mark.slow
def test_values_and_configs_are_read_as_omegaconf_reads_them(maxtext: dict[str, Any]) -> None:
    assert not maxtext["fields"]["loader_diffs"], maxtext["fields"]["loader_diffs"][:10]
    assert not maxtext["config_files"], f"read differently from OmegaConf: {maxtext['config_files']}"


@pytest.mark.slow
def test_checker_accepts_what_maxtexts_parser_accepts(maxtext: dict[str, Any]) -> None:
    for case in maxtext["parser"][: len(PARSER_ACCEPTS)]:
        assert case["maxtext"] is None, f"MaxText was expected to accept {case}"
        assert case["checker"] is None, f"the checker refuses what MaxText accepts: {case}"


@pytest.mark.slow
def test_checker_refuses_what_maxtexts_parser_refuses(maxtext: dict[str, Any]) -> None:
    for case in maxtext["parser"][len(PARSER_ACCEPTS) :]:
        assert case["maxtext"] is not None, f"MaxText was expected to refuse {case}"
        assert case["checker"] is not None, f"the checker accepts what MaxText refuses: {case}"
        line = case["overrides"][0]
        assert case["checker"].startswith(f"bad override {line!r}: "), case


@pytest.mark.parametrize(
    "override, message",
    [
        ("stepz=10", "MaxText has no key 'stepz' (did you mean 'steps'?)"),
        (
            "per_device_batch_sizee=2",
            "(did you mean 'per_device_batch_size' or 'eval_per_device_batch_size' or 'per_device_batch_size_start'?)",
        ),
        ("lora_rank=8", "MaxText has no key 'lora_rank' at the top level (did you mean 'lora.lora_rank'?)"),
        (
            "lora.lora_rnak=8",
            "MaxText has no key 'lora.lora_rnak' (did you mean 'lora.lora_rank' or 'lora.lora_alpha'?)",
        ),
        ("dpo.dpo_betta=0.2", "(did you mean 'dpo.dpo_beta'?) (MaxText would silently ignore it)"),
    ],
)
def test_unknown_key_is_refused_with_the_nearest_names(venv: Path, override: str, message: str) -> None:
    line = refused(check(venv, TINY, "steps=5", override))
    assert line.startswith(f"bad override '{override}': ") and line.endswith(message), line


@pytest.mark.parametrize(
    "override, message",
    [
        ("steps=ten", "steps takes an integer >= -1, e.g. steps=20"),  # tiny.yml's own value
        ("steps=1.5", "steps takes an integer >= -1"),
        ("learning_rate=abc", "learning_rate takes a number"),
        ("enable_checkpointing=maybe", "enable_checkpointing takes true or false, e.g. enable_checkpointing=false"),
        ("dtype=bf16", "dtype takes one of 'bfloat16', 'float32', "),
        ("dtype=bf16", "(did you mean 'bfloat16'?)"),
        ("model_name=llama3.18b", "(did you mean 'llama3.1-8b'"),
        ("run_name=123", "run_name takes a string; YAML reads this value as a number: quote it, run_name='123'"),
        ("run_name=a: b", "YAML reads this value as a mapping: quote it, run_name='a: b'"),
        ("profiler=", "for an empty string write profiler=''"),
        ("ici_parallelism=[1,a]", "ici_parallelism takes a list of integers or none, e.g. ici_parallelism=[1, 2]"),
        ("dropout_rate=2", "dropout_rate takes a number >= 0.0 and <= 1.0"),
        ("lora.lora_rank=-1", "lora.lora_rank takes an integer >= 0"),
        ("steps=[1", "the value is not valid YAML (did not find expected ',' or ']')"),
        ("run_name=[1", "quote it: run_name='[1'"),
    ],
)
def test_wrong_type_is_refused_saying_what_is_right(venv: Path, override: str, message: str) -> None:
    line = refused(check(venv, TINY, override))
    assert line.startswith(f"bad override '{override}': ") and message in line, line


def test_every_bad_override_is_counted_on_the_one_line(venv: Path) -> None:
    line = refused(check(venv, TINY, "stepz=1", "steps=5", "steps=x", "dtype=no"))
    assert line.startswith("bad override 'stepz=1': ") and line.endswith("(and 2 more bad overrides)"), line


def test_valid_overrides_of_every_kind_are_accepted(venv: Path) -> None:
    res = check(
        venv,
        TINY,
        "steps=100",  # integer
        "learning_rate=1e-4",  # float in exponent form
        "warmup_steps_fraction=0",  # an integer where a number is asked
        "enable_checkpointing=True",  # bool, as YAML writes it
        "packing=no",
        "run_name=my run",  # string with a space
        "run_name='007'",  # quoted number
        "dataset_type=hf",  # enum
        "attention=dot_product",  # free string in MaxText
        "hardware=gpu",  # literal
        "data_sharding=[[data, fsdp]]",  # any
        "ici_parallelism=[1, 1]",  # list of integers
        "train_data_columns=text",  # MaxText turns one name into a list
        "tokenizer_path=none",  # MaxText puts its default in
        "hf_path=allenai/c4",
        "grain_train_files=/shared/data/train*.array_record",
        "base_output_directory=/jobs/7",
        "lora.lora_rank=8",  # nested
        "run_name=run-${steps}",  # OmegaConf interpolation of another override
        "hf_access_token=",
    )
    assert res.returncode == 0 and not res.stderr and not res.stdout, res.stderr


def test_values_of_credentials_are_never_shown(venv: Path) -> None:
    secret = "8675309"  # reads as a number: refused (the token is a string)
    for override in (
        f"hf_access_token={secret}",
        f"hf_access_token=[{secret}",
        f"hf_access_token=*{secret}",
        f"student_overrides.api_key=[{secret}",
    ):
        line = refused(check(venv, TINY, override))
        key = override.partition("=")[0]
        assert secret not in line and f"'{key}=<hidden>'" in line, line
    # A proper token is accepted.
    assert check(venv, TINY, "hf_access_token=hf_aBcD1234").returncode == 0


def test_override_of_a_preset_key_needs_override_model_config(venv: Path) -> None:
    line = refused(check(venv, PRESET_CONFIG, "base_num_decoder_layers=4"))
    assert "preset for model llama3.1-8b sets base_num_decoder_layers: 32" in line, line
    assert line.endswith("add override_model_config=true"), line
    assert check(venv, PRESET_CONFIG, "base_num_decoder_layers=4", "override_model_config=true").returncode == 0
    assert check(venv, PRESET_CONFIG, "base_num_decoder_layers=32").returncode == 0


def _documented_overrides() -> list[str]:
    """key=value overrides shown in the README, docs and skills, placeholders left out."""
    keys = json.loads(SCHEMA.read_text(encoding="utf-8"))["fields"]
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "skills").rglob("*.md"))]:
        # Not inside quotes: docs quote refused overrides in the checker's messages.
        for m in re.finditer(
            r"(?<![\w$'-])([a-z][a-z0-9_.]*)=('[^'\s]*'|[^\s`'\"),;|]+)", path.read_text(encoding="utf-8")
        ):
            if m.group(1).split(".")[0] in keys and not re.search(r"[<>{}$]|^[A-Z]+$", m.group(2)):
                found.append(m.group(0).rstrip("."))
    return sorted(set(found))


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_passes_with_the_documented_overrides(venv: Path, config: Path) -> None:
    documented = _documented_overrides()
    assert len(documented) >= 15 and "steps=10" in documented, documented
    res = check(venv, config)
    assert res.returncode == 0 and not res.stderr, res.stderr
    res = check(venv, config, *documented)
    assert res.returncode == 0 and not res.stderr, res.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("stepz: 10\n", "bad config: {path} sets stepz: 10, but MaxText has no key 'stepz' (did you mean 'steps'?)"),
        ("steps: ten\n", 'bad config: {path} sets steps: "ten", but steps takes an integer >= -1'),
        ("steps: 1\nsteps: 2\n", "bad config: {path} is not valid YAML at line 3, column 1: duplicate key 'steps'"),
    ],
)
def test_keys_of_the_config_file_are_checked(venv: Path, tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "broken.yml"
    path.write_text('base_config: "base.yml"\n' + text, encoding="utf-8")
    line = refused(check(venv, path))
    assert line.startswith(message.format(path=path)), line


def test_overrides_are_not_taken_from_the_command_line(venv: Path) -> None:
    res = subprocess.run(
        [str(venv / "bin/python"), str(CHECK), str(TINY), "steps=5"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and res.stderr.startswith("Usage: check_config.py CONFIG.yml"), res.stderr


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(worker_main())
