"""Helpers the test modules import: plain functions and classes, no pytest fixtures (those live in
``tests/conftest.py``, so that a fixture of the whole test run runs once, not once per module that imports it)."""
