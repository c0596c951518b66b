"""The README's first command: serve the default model with the plugin and ask one question.

    python -m vllm_pcd.demo [--model PATH] [--url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

DEMO_MESSAGE = "I was charged twice. Please refund the duplicate charge."
DEMO_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["billing", "technical", "shipping", "account"],
                  "description": "The main issue in the message"},
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "refund_requested": {"type": "boolean",
                             "description": "Whether the customer asks for a refund"},
    },
    "required": ["topic", "sentiment", "refund_requested"],
    "additionalProperties": False,
}


def ask(url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    start = time.perf_counter()
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": DEMO_MESSAGE}],
        extra_body={"chat_template_kwargs": {"pcd_schema": DEMO_SCHEMA}})
    elapsed = time.perf_counter() - start
    diag = response.model_extra["pcd"]
    print(f"message : {DEMO_MESSAGE}")
    print(f"answer  : {response.choices[0].message.content}")
    print(f"latency : {elapsed * 1000:.0f} ms, backbone calls: {diag['backbone_calls']}, "
          f"tokens computed: {diag['tokens']['computed']} (ideal {diag['tokens']['ideal']} = "
          f"shared {diag['tokens']['shared']} + distinct branch {diag['tokens']['branch']})")
    for name, field in diag["fields"].items():
        options = ", ".join(f"{json.dumps(c['value'])}={c['probability']:.2f}"
                            for c in field["candidates"])
        print(f"  {name:18s} {options}  (margin {field['margin']:.2f}, uncalibrated)")


def main(argv: list[str] | None = None) -> int:
    from vllm_pcd.launch import serve
    from vllm_pcd.models import default_model_path, fast_dtype

    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.demo")
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--url", help="attach to a running server instead of starting one")
    args = parser.parse_args(argv)
    if args.url:
        ask(args.url)
        return 0
    print(f"starting: VLLM_PLUGINS=pcd vllm serve {args.model} (about a minute on a CPU)")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve(args.model, args=["--dtype", fast_dtype()],
                                        log_path="vllm-demo.log"))
        ask(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
