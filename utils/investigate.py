#!/usr/bin/env python3
"""Thin command: runs diagnosis/investigate.py under the project's Python (see utils/investigate.py --help)."""

from diagnosis import entry

entry.run("investigate")
