"""The server: the application factory, its workers and event loop."""
