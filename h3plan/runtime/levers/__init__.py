"""Each lever's own runtime, a module of the lever's name (h3plan/runtime/levers/<lever>.py), torch code of one of two
kinds. A lever whose install is more than an option at an existing call site: what its `Spec.model_step` installs
through the Site it is handed (h3plan/install/site.py `Site.runtime()`; the step cache, sparse attention), and what
its `Spec.input_step` readies before the block forwards (the linears that take fp8_act_quant's and the NVFP4 levers'
inputs: `inputs(model, decision, site)`). A block
lever: its call sites in the transformer block forward, `wrap(sites, options, kernels)` of the forward's sites
(h3plan/runtime/block_sites.py), which install/block.py composes in levers/rules.py `BLOCK_SITES` order; an attention
lever, the same over the attention processor's sites (h3plan/runtime/attention_sites.py) in `ATTENTION_SITES` order,
composed by install/attention.py; a VAE block lever, over the VAE decoder block's (h3plan/runtime/vae_sites.py) in
`VAE_BLOCK_SITES` order, with `settle` and `swaps`, composed by install/vae/block.py. Neither kind imports install
code: the Site, or the sites and kernels handed in, are its way into the model."""
