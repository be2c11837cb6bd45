#!/usr/bin/env python3
"""Thin command: runs diagnosis/sweep.py under the project's Python (see utils/sweep.py --help)."""

from diagnosis import entry

entry.run("sweep")
