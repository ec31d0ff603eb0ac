"""Auto's regret against an exhaustive sweep of the levers auto picks from measurements (attention backend, decode
precision, VAE tiles), on a hardware file: the packaged group, or a tuned one (no GPU: the plans' predictions rest
on the file's measurements; h3plan/actions/bench/regret.py says what that proves and what not).

    python benchmarks/regret.py [--out DIR] [hydra.searchpath=[file:///path] hardware=sm90_h200]

Writes regret-<hardware>.json / .md into DIR (default: print only); one row per recipe (bf16, bf16 + fp16 VAE, fp8).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3plan.actions.bench import regret  # noqa: E402

RECIPES = (["recipe=bf16"], ["recipe=bf16", "recipe.vae=fp16"], ["recipe=fp8"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args, overrides = ap.parse_known_args()
    results = [regret.sweep(overrides + r) for r in RECIPES]
    text = regret.markdown(results)
    print(text, end="")
    if args.out:
        hw = next((o.split("=", 1)[1] for o in overrides if o.startswith("hardware=")), "sm90")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"regret-{hw}.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / f"regret-{hw}.md").write_text(f"# Auto's regret on hardware={hw}\n\n" + text)
    worst = max((r["regret"] for r in results if r["regret"] is not None), default=None)
    return 0 if worst is None or worst <= regret.TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
