"""Screens of the dashboard, one per file."""
