"""Session-wide: every process a test starts is tied to the test run (see process_guard)."""

from process_guard import pytest_configure, pytest_unconfigure

__all__ = ["pytest_configure", "pytest_unconfigure"]
