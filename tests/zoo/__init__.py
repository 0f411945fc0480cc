"""The architecture zoo of issue 20: 25+ models, each measured on every backend (tests/zoo/runner.py)."""
