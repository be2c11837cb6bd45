"""Job monitor: watch jobs, notify, recover (utils/job_monitor.py)."""
