"""The torch-free facts every tier above reads: the decision type, the hardware YAML, the scale-table format,
shard sizes, the ring mesh, the VAE decode layout and the attention registry. Imports only errors/sources
and itself."""
