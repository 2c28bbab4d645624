"""specdec protos."""
