"""Reading profiler output (traces.py): a room below the diagnosis tools, importing none of them."""
