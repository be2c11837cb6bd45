"""An MCP server (stdio) over the read-only diagnosis tools: utils/mcp_server.py, docs/mcp.md.

server.py   the command line, the tools' registration (arguments from the commands' OPTIONS), stdio
reports.py  triage, diagnose, perf, investigate: the tools' Python APIs in-process, their reports as they print them
jobs.py     list_jobs and job_log_excerpt: the workspace and bounded excerpts of a job's log
promql.py   query_tsdb: PromQL over a job's saved TSDB, bounded
cache.py    results per job (its dir, log size and mtime, TSDB mtime) and arguments
config.py   the owner's config file that enables the write tool (0600, the user's own)
submit.py   the write tool: submit.sh --dry-run
"""
