"""The cluster model: kernel times (compute.py) and collective times (network.py) from a ClusterSpec."""
