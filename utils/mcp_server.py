#!/usr/bin/env python3
"""Thin command: runs mcpserver/server.py under the project's Python (see utils/mcp_server.py --help)."""

import entry

entry.run("server", package="mcpserver")
