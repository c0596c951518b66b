"""Prometheus metrics for PCD, exported on vLLM's own `/metrics` (the default registry, or
the multiprocess collector when vLLM runs several API servers)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

REQUESTS = Counter("pcd_requests_total", "PCD requests by mode and outcome",
                   ["mode", "outcome"])
LATENCY = Histogram("pcd_request_latency_seconds", "PCD request latency, schema to object",
                    ["mode"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
FIELDS = Histogram("pcd_request_fields", "Fields per answered PCD request",
                   buckets=(1, 2, 4, 8, 16, 32, 64))
CANDIDATES = Histogram("pcd_request_candidates", "Candidate values per answered PCD request",
                       buckets=(2, 4, 8, 16, 32, 64, 128, 256, 512))
TOKENS_COMPUTED = Counter("pcd_tokens_computed_total",
                          "Prompt tokens the engine computed for PCD requests")
RESTRICTED = Counter("pcd_restricted_head_requests_total",
                     "Engine requests that asked for the restricted LM head, by what the worker "
                     "did (measured from its outputs)", ["outcome"])


def record_answer(mode: str, fields: int, candidates: int, tokens_computed: int,
                  latency_s: float, projection: dict[str, Any]) -> None:
    REQUESTS.labels(mode, "ok").inc()
    RESTRICTED.labels("restricted").inc(projection["restricted_requests"])
    RESTRICTED.labels("fallback").inc(projection["fallbacks"])
    LATENCY.labels(mode).observe(latency_s)
    FIELDS.observe(fields)
    CANDIDATES.observe(candidates)
    TOKENS_COMPUTED.inc(tokens_computed)


def record_refusal(mode: str, outcome: str) -> None:
    """outcome: "rejected" (4xx before inference), "error" (engine fault), "cancelled"."""
    REQUESTS.labels(mode, outcome).inc()
