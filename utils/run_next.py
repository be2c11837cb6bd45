#!/usr/bin/env python3
"""Thin command: runs monitor/chain.py under the project's Python (see utils/run_next.py --help)."""

import entry

entry.run("chain", package="monitor")
