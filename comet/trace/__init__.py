"""Import profiler traces (Kineto, PyTorch ET, Chakra ET) into comet's flat op graph, export to Chakra ET,
and replay them against the measured iteration time (docs/traces.md)."""

from comet.trace.chakra import write_chakra
from comet.trace.graph_json import graph_from_json, graph_to_json, write_graph_json
from comet.trace.loader import load_trace

__all__ = ["load_trace", "write_chakra", "write_graph_json", "graph_to_json", "graph_from_json"]
