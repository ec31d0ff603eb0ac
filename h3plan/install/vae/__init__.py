"""diffusers' AutoencoderKLMiniMaxH3 under a plan: the VAE install side (torch). Its torch-free decode layout and
planning numbers are h3plan/facts/vae/ (tiling.py, parallel_plan.py).

install.py       the installer's VAE entry (recognise, apply, skips); block.py, fp8.py, graph.py, weights.py,
                 parallel.py the swaps it makes

This package imports nothing eagerly.
"""
