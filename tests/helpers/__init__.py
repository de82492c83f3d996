"""Shared test helpers (not test modules): fixtures live in tests/conftest.py."""
