"""What the provider billed: ledger entries, the usage ledger and ``compact-proxy report``."""
