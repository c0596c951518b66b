"""The README's first command: serve the default model with the plugin and ask one question.

    python -m vllm_pcd.demo [--model PATH] [--url URL [--api-key KEY]]

It prints the answer object, the backbone calls, the tokens and every field's scores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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


# vLLM reveals prompt-cache hits, and so the tokens a request computed, only to a server
# started with this flag (the demo's own server is).
TOKENS_FLAG = "--enable-prompt-tokens-details"
TOKENS_HIDDEN = f"computed: hidden (start the server with {TOKENS_FLAG} to see cache hits)"


def report(content: str, diag: dict, elapsed_s: float) -> list[str]:
    """The demo's lines for one answer: the object, the backbone calls, the tokens (the
    computed count where the server reveals it) and every field's scores."""
    calls = diag.get("backbone_calls")
    tokens = diag["tokens"]
    ideal = (f"ideal {tokens['ideal']} = shared {tokens['shared']} "
             f"+ distinct branch {tokens['branch']}")
    computed = (f"computed {tokens['computed']} ({ideal})" if "computed" in tokens
                else f"{ideal}; {TOKENS_HIDDEN}")
    lines = [f"message : {DEMO_MESSAGE}",
             f"answer  : {content}",
             f"calls   : {calls if calls is not None else 'not reported'} backbone calls, "
             f"{elapsed_s * 1000:.0f} ms at the client",
             f"tokens  : {computed}",
             "scores  : " + ("calibrated" if diag.get("calibrated") else "uncalibrated")]
    for name, field in diag["fields"].items():
        options = ", ".join(f"{json.dumps(c['value'])}={c['probability']:.2f}"
                            for c in field["candidates"])
        margin = field.get("margin")
        lines.append(f"  {name:18s} {options}" + ("" if margin is None else
                                                 f"  (margin {margin:.2f})"))
    return lines


def ask(url: str, api_key: str = "unused") -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=api_key)
    model = client.models.list().data[0].id
    start = time.perf_counter()
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": DEMO_MESSAGE}],
        extra_body={"chat_template_kwargs": {"pcd_schema": DEMO_SCHEMA}})
    elapsed = time.perf_counter() - start
    for line in report(response.choices[0].message.content, response.model_extra["pcd"],
                       elapsed):
        print(line)


def main(argv: list[str] | None = None) -> int:
    from vllm_pcd.launch import serve
    from vllm_pcd.models import default_model_path, fast_dtype

    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.demo")
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--url", help="attach to a running server instead of starting one")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"),
                        help="the --url server's API key (default: $OPENAI_API_KEY)")
    args = parser.parse_args(argv)
    if args.url:
        ask(args.url, args.api_key)
        return 0
    print(f"starting: VLLM_PLUGINS=pcd vllm serve {args.model} (about a minute on a CPU)")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve(args.model, args=["--dtype", fast_dtype(), TOKENS_FLAG],
                                        log_path="vllm-demo.log"))
        ask(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
