"""The VAE decode's torch-free layout (tiling.py), the vae_parallel lever's planning numbers (parallel_plan.py), the
decode measured on a device (decode.py), and the encodes a request makes (encode.py)."""
