"""Widgets of the dashboard, by the thing they show."""
