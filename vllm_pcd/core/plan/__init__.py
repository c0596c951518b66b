"""The planning room: a schema, a conversation and `Options` → the engine requests to ask.

`build_plan` renders the prompt (`prompt`), cuts every branch from one tokenization of the
whole text (`in_context`, `sequence`), and orders conditioned rounds (`conditioning`).
Everything outside imports from here.
"""

from vllm_pcd.core.plan.options import KEYS, Options
from vllm_pcd.core.plan.prompt import (
    DEFAULT_FORMULATION, DEFAULT_LAYOUT, FORMULATION_NAMES, FORMULATIONS, LAYOUT_NAMES, LAYOUTS,
    RECAP, Formulation, Layout, check_conversation, instruction_text, raw_prefixes, render_text)
from vllm_pcd.core.plan.in_context import Cancelled, InContext, split_tail
from vllm_pcd.core.plan.sequence import (
    SequenceFieldPlan, build_sequence_field, common_prefix, serialize)
from vllm_pcd.core.plan.conditioning import Answered, conditions, read_values
from vllm_pcd.core.plan.build import (
    ConstantFieldPlan, FieldPlan, Plan, Scoring, build_plan, choose_codes)

__all__ = [
    "KEYS", "Options", "DEFAULT_FORMULATION", "DEFAULT_LAYOUT", "FORMULATION_NAMES", "FORMULATIONS",
    "LAYOUT_NAMES", "LAYOUTS", "RECAP", "Formulation", "Layout", "check_conversation",
    "instruction_text", "raw_prefixes", "render_text", "Cancelled", "InContext", "split_tail",
    "SequenceFieldPlan", "build_sequence_field", "common_prefix", "serialize", "Answered",
    "conditions", "read_values", "ConstantFieldPlan", "FieldPlan", "Plan", "Scoring", "build_plan",
    "choose_codes"]
