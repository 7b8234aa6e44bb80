"""The three storage tiers: hot (Redis or in-process), warm and cold (SQL)."""
