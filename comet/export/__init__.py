"""Exports of one candidate to other simulators (ASTRA-sim: comet/export/astra_sim.py)."""
