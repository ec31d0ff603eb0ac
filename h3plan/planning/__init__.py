"""The plan side, torch-free: the pipeline config (schema, config) -> the request (request, memory, derive)
-> the plan (the planner itself is h3plan/planner.py, its levers h3plan/levers/, the facts they read h3plan/facts/;
h3plan/from_model.py plans for a model in hand).

CONF: the packaged config groups (defined in h3plan/facts/__init__.py, the tier below).
"""

from h3plan.facts import CONF

__all__ = ["CONF"]
