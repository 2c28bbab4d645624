"""The coordinator's step loop: scheduling, requests and their log, drafting, the step
streams to the model services, the draft breaker, stats. Never imports torch."""
