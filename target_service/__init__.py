"""specdec target_service."""
