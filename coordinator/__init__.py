"""specdec coordinator."""
