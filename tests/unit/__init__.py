"""Pure tests: no vLLM engine and no served process."""
