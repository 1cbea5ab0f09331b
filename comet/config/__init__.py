"""Frozen, validated inputs: model, cluster, parallel configuration and training job."""
