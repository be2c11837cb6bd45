#!/usr/bin/env python3
"""Thin command: runs diagnosis/triage.py under the project's Python (see utils/triage.py --help)."""

from diagnosis import entry

entry.run("triage")
