#!/usr/bin/env python3
"""Thin command: runs diagnosis/investigate.py under the project's Python (see utils/investigate.py --help)."""

import entry

entry.run("investigate")
