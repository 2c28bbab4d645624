"""OpenTelemetry setup shared by the coordinator and the model services."""
