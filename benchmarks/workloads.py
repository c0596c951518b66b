"""The synthetic workloads benchmarks and tests share: a schema of N finite-choice fields and
support-ticket texts of a chosen token length, seeded, so every run asks the same."""

from __future__ import annotations

import random
from typing import Any

# (name, description, options); booleans have no options.
_ENUMS = [
    ("topic", "The main issue", ["billing", "technical", "shipping", "account"]),
    ("sentiment", "Overall tone of the customer", ["positive", "neutral", "negative"]),
    ("priority", "How urgently support should act", ["low", "medium", "high", "critical"]),
    ("product", "Device the ticket is about",
     ["router", "modem", "mesh_extender", "set_top_box", "phone"]),
    ("channel", "How the customer wants to be contacted", ["email", "phone", "chat"]),
    ("customer_tier", "Plan the customer is on", ["free", "basic", "premium", "enterprise"]),
    ("register", "Language register of the message", ["formal", "casual", "angry"]),
    ("resolution", "What the customer asks for",
     ["refund", "replacement", "repair", "explanation", "escalation"]),
    ("region", "Where the customer lives", ["north", "south", "east", "west"]),
    ("payment_method", "Payment method mentioned",
     ["credit_card", "debit_card", "paypal", "bank_transfer"]),
    ("contract", "Contract length", ["monthly", "yearly", "two_year"]),
    ("issue_age", "When the problem started", ["today", "this_week", "this_month", "older"]),
    ("device_os", "Operating system mentioned", ["windows", "macos", "linux", "android", "ios"]),
    ("next_step", "What support should do next", ["reply", "call", "visit", "close"]),
    ("tone_needed", "Tone the reply should take", ["apologetic", "informative", "firm"]),
    ("department", "Team that should own the ticket",
     ["support", "sales", "billing_team", "logistics", "legal"]),
]
_BOOLEANS = [
    ("refund_requested", "Whether the customer asks for a refund"),
    ("is_urgent", "Whether the customer says it is urgent"),
    ("mentions_competitor", "Whether another provider is named"),
    ("wants_callback", "Whether the customer asks to be called back"),
    ("repeat_contact", "Whether the customer contacted support before about this"),
    ("threatens_cancellation", "Whether the customer threatens to cancel"),
    ("legal_action", "Whether legal steps are mentioned"),
    ("has_order_number", "Whether an order number is given"),
    ("asks_for_manager", "Whether the customer asks for a manager"),
    ("praises_agent", "Whether a support agent is praised"),
    ("reports_outage", "Whether a service outage is reported"),
    ("security_concern", "Whether account security is a concern"),
    ("business_customer", "Whether the customer writes for a business"),
    ("wants_discount", "Whether a discount is requested"),
    ("has_deadline", "Whether a deadline is mentioned"),
    ("has_attachment", "Whether the customer refers to an attachment"),
]
_SENTENCES = [
    "My router keeps dropping the connection every evening around eight.",
    "I have already restarted it three times today and nothing changed.",
    "This is the second time this month I am writing to you about it.",
    "My order number is 48213 and the device arrived last Tuesday.",
    "I work from home, so a stable connection is essential for my job.",
    "Your competitor offered me a faster plan for less money.",
    "The invoice for March shows a charge I do not recognise.",
    "I paid with my credit card as usual, but the amount is higher.",
    "The agent I spoke to on the phone yesterday was very kind and patient.",
    "Still, the problem is not solved and I am running out of patience.",
    "Please call me back tomorrow morning if you can.",
    "If this is not fixed by Friday I will cancel my contract.",
    "The lights on the modem blink orange and then turn off.",
    "My laptop runs Windows and the phone is an Android device.",
    "I attached a screenshot of the error message to this email.",
    "We are a small business with five employees depending on this line.",
    "I would appreciate a discount for the days without service.",
    "Nobody in my street seems to have internet since this morning.",
    "I changed my password after a strange login notification.",
    "The set-top box also freezes when I switch channels.",
    "I am on the premium plan and expected better support.",
    "I would like a replacement device rather than another repair visit.",
    "The technician said the cable in the basement might be damaged.",
    "I have been a loyal customer for more than ten years.",
]


def synthetic_schema(n_fields: int) -> dict[str, Any]:
    """Enum and boolean fields alternating, enums of 3-5 values, each with a description."""
    if n_fields > len(_ENUMS) + len(_BOOLEANS):
        raise ValueError(f"at most {len(_ENUMS) + len(_BOOLEANS)} synthetic fields")
    properties = {}
    for i in range(n_fields):
        if i % 2 == 0:
            name, about, options = _ENUMS[i // 2]
            properties[name] = {"type": "string", "enum": options, "description": about}
        else:
            name, about = _BOOLEANS[i // 2]
            properties[name] = {"type": "boolean", "description": about}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def synthetic_ticket(tokenizer: Any, n_tokens: int, seed: int = 0) -> str:
    """Support-ticket sentences in a seeded random order until about `n_tokens` tokens."""
    rng = random.Random(seed)
    sentences: list[str] = []
    while len(tokenizer.encode(" ".join(sentences), add_special_tokens=False)) < n_tokens:
        pool = list(_SENTENCES)
        rng.shuffle(pool)
        for sentence in pool:
            sentences.append(sentence)
            if len(tokenizer.encode(" ".join(sentences), add_special_tokens=False)) >= n_tokens:
                break
    return " ".join(sentences)


def tickets(tokenizer: Any, docs: int, seed: int) -> list[str]:
    return [synthetic_ticket(tokenizer, 100 + (i * 37) % 150, seed=seed + i) for i in range(docs)]
