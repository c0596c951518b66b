"""Tests that start a served process: `vllm serve`, `vllm run-batch`, the demo."""
