"""Replay: compiled arrays in, start/end times out (event engine for op graphs, pipeline solver for steps)."""
