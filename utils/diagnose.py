#!/usr/bin/env python3
"""Thin command: runs diagnosis/diagnose.py under the project's Python (see utils/diagnose.py --help)."""

import entry

entry.run("diagnose")
