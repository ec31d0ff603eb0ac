"""The linears of the transformer's blocks and the VAE decoder's, as module paths relative to a block (torch-free).

diffusers' block: attention q, k, v and its output projection, then the SwiGLU FFN's input and output projections.
These six are what gemm_quant quantises, what the FP8 / NVFP4 input producers feed and what a LoRA's linears are
checked against; the AdaLN projection (`adaln_proj`) and the norms are not among them. MiniMaxH3TokenRefinerBlock
names its linears the same way.
"""

BLOCK_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
VAE_BLOCK_LINEARS = BLOCK_LINEARS  # the VAE decoder's MiniMaxH3VideoTransformerBlock names its six linears alike

__all__ = ["BLOCK_LINEARS", "VAE_BLOCK_LINEARS"]
