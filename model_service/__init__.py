"""The gRPC shell both model services share: config and flags, status codes, the executor,
the base servicer, proto converters, batching of steps from several coordinators."""
