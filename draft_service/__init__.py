"""specdec draft_service."""
