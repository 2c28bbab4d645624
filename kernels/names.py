"""The names the kernels answer to, importable without torch (the services' flags and the
stack's configuration list them as choices)."""

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
ATTENTION_BACKENDS = ("auto", "reference", "cpu", "flashinfer")
