"""Roles of the runtime: need parser, planner, evidence critic, finalizer, answer critic (+ memory summarizer).

`base.py` fixes the interfaces; `openai_roles.py` implements them over an OpenAI-compatible chat client with the
prompts in `prompts/`; `collect.teacher` implements them offline for the embedded world."""
