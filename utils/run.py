#!/usr/bin/env python3
"""Thin command: runs diagnosis/runs.py under the project's Python (see utils/run.py --help)."""

import entry

entry.run("runs")
