"""Cross-backend tests: each runs for every installed first-party CPU backend (issue 5)."""
