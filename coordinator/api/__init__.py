"""The coordinator's public APIs: specdec.v1, the gateway worker (vllm.grpc.engine), admission
checks, chat templates, detokenizing."""
