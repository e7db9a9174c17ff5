"""Reliability and security tests (issue #5): faults, leaks, load, durability, hostile input."""
