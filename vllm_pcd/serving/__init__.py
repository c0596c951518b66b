"""PCD on vLLM's API server: the endpoint plugin, the chat answer, the decision routes and
the request guard. Thin: each request is checked here, then answered by `vllm_pcd.pipeline`.
"""
