#!/usr/bin/env python3
"""Thin command: runs diagnosis/verify.py under the project's Python (see utils/verify.py --help)."""

import entry

entry.run("verify")
