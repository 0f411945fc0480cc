"""The architecture zoo of issue 20, measured on every backend by tests/zoo/runner.py."""
