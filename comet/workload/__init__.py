"""Workload: what a training step computes and stores (memory model, step graph builder)."""
