"""The model zoo: one YAML file per model (see comet/config/model.py for the fields)."""
