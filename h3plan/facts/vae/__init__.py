"""The VAE decode's torch-free layout (tiling.py) and the vae_parallel lever's planning numbers
(parallel_plan.py), and the encodes a request makes (encode.py)."""
