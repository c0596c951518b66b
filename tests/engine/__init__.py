"""Tests that build a vLLM engine in process (or in a child process of their own)."""
