"""specdec: the CLI, the stack launcher and supervisor, the gateway launcher, demo and bench.

Every part of the project installs under this namespace (specdec.coordinator,
specdec.runtime, ...); see pyproject.toml.
"""
