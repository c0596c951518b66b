"""PCD's pure core: schema → options → plan → scores → object.

Nothing here imports vLLM, torch or an HTTP framework (a test enforces it): the core needs a
tokenizer to plan and the engine's log-probabilities to score, and nothing else. Read it in
the order of a request: `schema`, `options`, `plan` (with `prompt`, `in_context` and
`sequence`), `execution` (what the engine reports), `scoring`, `result`.
"""
