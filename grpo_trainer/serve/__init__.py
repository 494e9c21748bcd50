"""The built-in inference server: an OpenAI/vLLM-compatible completions API over transformers."""
