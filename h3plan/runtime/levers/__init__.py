"""Each lever's own runtime, a module of the lever's name (h3plan/runtime/levers/<lever>.py): torch code a lever's
`Spec.model_step` installs through the Site it is handed (h3plan/install/site.py `Site.runtime()`), for a lever whose
install is more than an option at an existing call site. It imports no install code: the Site is its way into the
model (named hooks, kernels, guarded calls, the report)."""
