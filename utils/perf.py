#!/usr/bin/env python3
"""Thin command: runs diagnosis/perf.py under the project's Python (see utils/perf.py --help)."""

import entry

entry.run("perf")
