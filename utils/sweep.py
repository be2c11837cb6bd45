#!/usr/bin/env python3
"""Thin command: runs sweep/cli.py under the project's Python (see utils/sweep.py --help)."""

import entry

entry.run("cli", package="sweep")
