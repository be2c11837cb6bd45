"""Notifications of the job monitor through Apprise (docs/notifications.md).

`load(path)` reads the destinations, Apprise URLs in Apprise's own text config format, from a
file that only its owner may read (0600, refused otherwise: the URLs hold tokens); `Notifier.send`
delivers one message to all of them and never raises; `Outbox` keeps every message in a 0600 JSON
file beside the job's monitor state until it is delivered, retrying with back-off, each key once.
Nothing here prints or logs a destination but in Apprise's privacy form (secrets masked).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import apprise

from monitor.store import Dir, read_file

LEVELS = {
    "info": apprise.NotifyType.INFO,
    "success": apprise.NotifyType.SUCCESS,
    "warning": apprise.NotifyType.WARNING,
    "failure": apprise.NotifyType.FAILURE,
}
FIRST_RETRY, LAST_RETRY = 10.0, 600.0  # seconds: back-off from 10 s, doubling, up to 10 min

# Apprise logs the URLs it loads and calls (DEBUG/INFO, and an ERROR line naming a bad URL):
# keep every record of its logger out of our output.
_alog = logging.getLogger("apprise")
_alog.setLevel(logging.CRITICAL + 1)
_alog.propagate = False
_alog.addHandler(logging.NullHandler())


class NotifyConfigError(ValueError):
    """The notification config cannot be used (one line: what is wrong, what would be right)."""


def default_config_path() -> Path:
    """$MST_NOTIFY_CONFIG, else ~/.config/maxtext-slurm/notify.conf."""
    env = os.environ.get("MST_NOTIFY_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "maxtext-slurm" / "notify.conf"


class Notifier:
    """The destinations of one config file."""

    def __init__(self, ap: apprise.Apprise, path: Path) -> None:
        self._ap, self.path = ap, path

    def destinations(self) -> list[str]:
        """The destinations with their secrets masked."""
        return [s.url(privacy=True) for s in self._ap]

    def send(self, title: str, body: str, kind: str = "info") -> bool:
        """Deliver to every destination; False when any did not take it (never raises)."""
        try:
            return bool(self._ap.notify(title=title, body=body or title, notify_type=LEVELS.get(kind, LEVELS["info"])))
        except Exception:  # noqa: BLE001 - a notifier must never take the monitor down
            return False


def load(path: Path) -> Notifier:
    """The notifier of config file `path`; NotifyConfigError when it is missing, not a regular
    file, not the caller's, readable or writable by others, or holds no URL Apprise accepts."""
    try:  # one open file for every check and the read: nothing can be swapped in between
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotifyConfigError(
            f"notify config {path} does not exist: write your Apprise URLs there, one per line, "
            f"and chmod 600 it (docs/notifications.md)"
        ) from None
    except OSError as e:
        raise NotifyConfigError(
            f"notify config {path} cannot be opened ({e.strerror}): give a regular file of yours"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotifyConfigError(f"notify config {path} is not a regular file: give the file that holds the URLs")
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
        if st.st_uid != os.getuid():
            raise NotifyConfigError(
                f"notify config {path} belongs to uid {st.st_uid}, not to you ({os.getuid()}): use a file of your own"
            )
        if st.st_mode & 0o077:
            raise NotifyConfigError(
                f"notify config {path} is open to others (mode {stat.S_IMODE(st.st_mode):04o}): it holds "
                f"credentials; chmod 600 {path}"
            )
        text = f.read()
    conf = apprise.AppriseConfig()
    ap = apprise.Apprise()
    if conf.add_config(text, format="text"):
        ap.add(conf)
    if len(ap) == 0:
        raise NotifyConfigError(
            f"notify config {path} holds no destination Apprise accepts: one URL per line, e.g. "
            "ntfy://ntfy.example.com/my-topic or json://host:port/path (docs/notifications.md)"
        )
    return Notifier(ap, path)


def _write_private(path: Path, data: object) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Outbox:
    """Messages to deliver, kept in `path` (0600) until delivered; a key is put once, ever. With
    `home` (the monitor's directory, held open: monitor/store.py) the file is read and written
    through it, only when it is ours to trust (else trust.UntrustedPath)."""

    def __init__(
        self, path: Path, notifier: Notifier | None, log: Callable[[str], None], home: Dir | None = None
    ) -> None:
        self.path, self.notifier, self.log, self.home = path, notifier, log, home
        self.items: list[dict] = []
        try:
            if home is not None:
                data = home.read(path.name, "the notification outbox")
            else:
                data = read_file(path, "the notification outbox", path)
            if data is not None:
                self.items = json.loads(data)
        except (OSError, ValueError) as e:
            log(f"notify: {path} unreadable ({e}); starting a new outbox")

    def put(self, key: str, title: str, body: str, kind: str) -> None:
        if any(i["key"] == key for i in self.items):
            return
        self.items.append(
            {"key": key, "title": title, "body": body, "kind": kind, "state": "pending", "attempts": 0, "next": 0.0}
        )
        self._save()

    def pending(self) -> list[str]:
        """Keys not delivered yet (none without a notifier: there is nowhere to deliver)."""
        if self.notifier is None:
            return []
        return [i["key"] for i in self.items if i["state"] == "pending"]

    def flush(self, now: float | None = None) -> int:
        """Try the messages that are due, in order; the number delivered."""
        if self.notifier is None:
            return 0
        now = time.time() if now is None else now
        sent = 0
        for i in self.items:
            if i["state"] != "pending" or i["next"] > now:
                continue
            i["attempts"] += 1
            if self.notifier.send(i["title"], i["body"], i["kind"]):
                i["state"], i["delivered"] = "delivered", now
                sent += 1
            else:
                wait = min(LAST_RETRY, FIRST_RETRY * 2 ** (i["attempts"] - 1))
                i["next"] = now + wait
                self.log(f"notify: delivery of '{i['key']}' failed (attempt {i['attempts']}), retrying in {wait:g} s")
        if any(i["attempts"] for i in self.items):
            self._save()
        return sent

    def _save(self) -> None:
        if self.home is not None:
            self.home.write_json(self.path.name, self.items)
        else:
            _write_private(self.path, self.items)
