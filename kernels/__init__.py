"""specdec kernels."""
