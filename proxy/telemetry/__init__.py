"""Logs, metrics and what keeps secrets out of them."""
