"""The ``compact-proxy`` command."""
