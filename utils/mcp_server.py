#!/usr/bin/env python3
"""Thin command: runs mcpserver/command.py under the project's Python (see utils/mcp_server.py --help)."""

import entry

entry.run("command", package="mcpserver")
