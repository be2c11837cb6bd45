"""Interim stand-in (replaced by the Apprise notifier on merge)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


class NotifyConfigError(ValueError):
    pass


def default_config_path() -> Path:
    return Path(os.environ.get("MST_NOTIFY_CONFIG") or Path.home() / ".config/maxtext-slurm/notify.conf")


class Notifier:
    def send(self, title: str, body: str, kind: str = "info") -> bool:
        return False

    def destinations(self) -> list[str]:
        return []


def load(path: Path) -> Notifier:
    raise NotifyConfigError(f"{path}: not yet")


class Outbox:
    def __init__(self, path: Path, notifier: Notifier | None, log: Callable[[str], None]) -> None:
        self.path, self.notifier, self.log = path, notifier, log
        self.items: list[dict] = json.loads(path.read_text()) if path.exists() else []

    def put(self, key: str, title: str, body: str, kind: str) -> None:
        if key not in [i["key"] for i in self.items]:
            self.items.append({"key": key, "title": title, "body": body, "kind": kind, "done": False})
            self.path.write_text(json.dumps(self.items))

    def flush(self, now: float | None = None) -> int:
        return 0

    def pending(self) -> list[str]:
        return []
