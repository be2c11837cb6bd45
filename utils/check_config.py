#!/usr/bin/env python3
"""Usage: check_config.py CONFIG.yml

Fast sanity check of a model config before anything is submitted: the file must be valid
YAML holding a mapping with a base_config. Prints one line and exits 1 when it is not.
(The full check through MaxText's own parser is tests/test_configs.py.)
"""

import sys

import yaml


def check(path: str) -> str | None:
    """Return None when the config is usable, else a one-line reason."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        return f"{path} is not valid YAML{where}: {problem}"
    if not isinstance(data, dict):
        return f"{path} must be a YAML mapping of MaxText keys (key: value), got {type(data).__name__}"
    if "base_config" not in data:
        return f'{path} has no base_config; add base_config: "base.yml"'
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 else 2
    reason = check(argv[1])
    if reason:
        print(f"bad config: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
