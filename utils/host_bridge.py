#!/usr/bin/env python3
"""Thin command: runs bridge/cli.py under the project's Python (see utils/host_bridge.py --help).
Its `call` also runs under a container's python3 (3.8 or newer) without the environment."""

import entry

entry.run("cli", package="bridge", oldest=(3, 8))
