"""diffusers' AutoencoderKLMiniMaxH3 under a plan: its one tiling model and the VAE install side.

tiling.py        the decode's layout, torch-free: temporal chunks, spatial tiles (diffusers' `_split_tiles`),
                 the tile rules; what memory.py, parallel_plan.py and the installer all read
parallel_plan.py the vae_parallel lever's planning numbers (work items, shares, gather bytes, time), torch-free
install.py       the installer's VAE entry (recognise, apply, skips); block.py, fp8.py, graph.py, weights.py,
                 parallel.py the swaps it makes (torch)

This package imports nothing eagerly, so the plan side reads tiling.py and parallel_plan.py without torch.
"""
