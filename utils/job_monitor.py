#!/usr/bin/env python3
"""Thin command: runs monitor/cli.py under the project's Python (see utils/job_monitor.py --help)."""

import entry

entry.run("cli", package="monitor")
