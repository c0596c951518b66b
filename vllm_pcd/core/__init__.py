"""PCD's pure core: schema → options → plan → scores → object, in rooms.

Nothing here imports vLLM, torch or an HTTP framework (a test enforces it): the core needs a
tokenizer to plan and the engine's log-probabilities to score, and nothing else. Read it in
the order of a request, a room each: `schema` (the JSON Schema → finite-choice fields),
`plan` (the options and the engine requests to ask), `scoring` (the engine's reports → each
field's result), then `profiles` (fitted calibration per schema and options) and `result`
(the call's answer). A room's `__init__` is its face: nothing outside imports its modules.
"""
