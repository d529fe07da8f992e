"""Helpers shared by the test suite (workers for runner processes, etc.)."""
