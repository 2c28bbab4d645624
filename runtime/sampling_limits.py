"""The limits on a request's sampling parameters, in one place for both sides: the
coordinator checks them at admission (it has no torch), the model services again where a
request enters them (``runtime.sampling``)."""

# Below this a temperature is greedy (vLLM's _SAMPLING_EPS): dividing float32 logits by
# 1e-38 overflows to inf.
MIN_SAMPLING_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20  # top logprobs per token (OpenAI's top_logprobs limit)
