"""The plan side, torch-free: the pipeline config (schema, config) -> the request (request, memory, derive)
-> the plan (decision; the planner itself is h3plan/planner.py, its levers h3plan/levers/).

CONF: the packaged config groups (h3plan/conf links to the repository's conf/; installs copy it in).
"""

import os

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
