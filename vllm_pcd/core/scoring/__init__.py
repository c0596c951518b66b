"""The scoring room: the engine's log-probabilities → each field's result.

A field's score is read here and nowhere else: its requests' reports (`execution`), the
allowed tokens renormalised and length-normalised (`scores`, `trie` for values of several
tokens), the value a decision chooses (`decision`, `field_result`), the prior divided out
(`content_free`, `batch`), fitted maps (`fitting`) and draws (`sampling`). A field's plan
is a `FieldScorer`; everything outside imports from here.
"""

from vllm_pcd.core.scoring.execution import Execution, RequestReport
from vllm_pcd.core.scoring.decision import DECISIONS
from vllm_pcd.core.scoring.field_result import FieldResult, assemble
from vllm_pcd.core.scoring.scores import (
    CALIBRATIONS, NORMALIZATIONS, FieldScorer, ScoredPlan, calibrate, field_result, field_results,
    log_softmax, token_field, vocabulary_extra)
from vllm_pcd.core.scoring.trie import Node, among_children, edge_logprobs, trie_field
from vllm_pcd.core.scoring.content_free import (
    PendingPrior, Prior, PriorCache, content_free_messages, prior_key)
from vllm_pcd.core.scoring.batch import MIN_DOCUMENTS, RunningPriors, batch_prior, too_few
from vllm_pcd.core.scoring.fitting import (
    METHODS, OBJECTIVES, Calibrator, Identity, OptionBias, Row, Temperature, answer_points,
    balanced_accuracy, calibrator_from_dict, choose, expected_calibration_error, folds, halves,
    reliability, stepwise_kept)
from vllm_pcd.core.scoring.sampling import draw_values, value_distribution

__all__ = [
    "Execution", "RequestReport", "DECISIONS", "FieldResult", "assemble", "CALIBRATIONS",
    "NORMALIZATIONS", "FieldScorer", "ScoredPlan", "calibrate", "field_result", "field_results",
    "log_softmax", "token_field", "vocabulary_extra", "Node", "among_children", "edge_logprobs",
    "trie_field", "PendingPrior", "Prior", "PriorCache", "content_free_messages", "prior_key",
    "MIN_DOCUMENTS", "RunningPriors", "batch_prior", "too_few", "METHODS", "OBJECTIVES",
    "Calibrator", "Identity", "OptionBias", "Row", "Temperature", "answer_points",
    "balanced_accuracy", "calibrator_from_dict", "choose", "expected_calibration_error", "folds",
    "halves", "reliability", "stepwise_kept", "draw_values", "value_distribution"]
