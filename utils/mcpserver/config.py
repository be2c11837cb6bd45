"""The owner's config file, the only way to enable a write tool.

~/.config/maxtext-slurm/mcp.toml ($XDG_CONFIG_HOME honoured, or --config FILE):

    allow_submit = true   # the submit tool (submit.sh ... --dry-run) is listed

It is read only when it is a regular file of this user with no permission for group or others
(0600 or 0400); any other file enables nothing and says why on stderr. No file: read-only tools only.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Config:
    allow_submit: bool = False
    refused: str | None = None  # why the file enables nothing (it exists but is not safe or not valid)


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "maxtext-slurm" / "mcp.toml"


def load(path: Path | None = None) -> Config:
    """The config at PATH (default_path()); Config() when there is none."""
    p = path or default_path()
    try:
        st = p.lstat()
    except FileNotFoundError:
        return Config()
    except OSError as e:
        return Config(refused=f"{p}: cannot read it ({e.strerror or e}); write tools stay off")
    if not stat.S_ISREG(st.st_mode):
        return Config(refused=f"{p} is not a regular file (a symlink?); write tools stay off")
    if st.st_uid != os.getuid():
        return Config(refused=f"{p} belongs to uid {st.st_uid}, not you; write tools stay off")
    if st.st_mode & 0o077:
        return Config(
            refused=f"{p} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may read or write it; "
            f"chmod 600 {p} (write tools stay off until then)"
        )
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return Config(refused=f"{p} is not valid TOML ({e}); write tools stay off")
    unknown = set(data) - {"allow_submit"}
    if unknown:
        return Config(refused=f"{p}: unknown settings {sorted(unknown)} (known: allow_submit); write tools stay off")
    allow = data.get("allow_submit", False)
    if not isinstance(allow, bool):
        return Config(refused=f"{p}: allow_submit must be true or false; write tools stay off")
    return Config(allow_submit=allow)
