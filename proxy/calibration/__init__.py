"""What the provider's counts teach: per-session correction factors and learnt windows."""
