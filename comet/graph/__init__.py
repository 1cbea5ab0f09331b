"""The execution-graph IR shared by built and imported traces (see ir.py)."""
