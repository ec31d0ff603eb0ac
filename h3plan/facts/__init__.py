"""The torch-free facts every tier above reads: the decision type, the hardware YAML, the packaged pipeline group,
the workflows and their partitions, the block linears, the scale-table format, shard sizes, the ring mesh, the VAE
decode layout and the attention registry. Imports only errors/sources and itself.

CONF: the packaged config groups (h3plan/conf links to the repository's conf/; installs copy it in).
"""

import os

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
