"""Rollout engines: the protocol and its types, Hugging Face ``generate`` (the embedded default) and
vLLM (optional extra; colocated or an OpenAI-compatible server)."""
