#!/usr/bin/env python3
"""Thin command: runs diagnosis/triage.py under the project's Python (see utils/triage.py --help)."""

import entry

entry.run("triage")
