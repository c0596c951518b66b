"""vllm-pcd: Parallel Constrained Decoding for vLLM.

`constrained(llm, text, schema)` answers a closed schema of boolean and enum fields about a
text with a `vllm.LLM`; the `pcd` plugins serve the same through `vllm serve`.
"""

from vllm_pcd.core.plan import Options
from vllm_pcd.core.schema import Limits, SchemaError, parse_schema

__all__ = ["Limits", "Options", "SchemaError", "constrained", "parse_schema"]


def __getattr__(name: str):
    # Importing vLLM is slow; the pure core (schema, plan) must not pay for it.
    if name == "constrained":
        from vllm_pcd.pipeline import constrained

        return constrained
    raise AttributeError(name)
