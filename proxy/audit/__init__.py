"""The audit log: its entries and how the CLI lays them out."""
