"""How far apart are a false find's outputs from the true input's? For each result row that was
found but not exact, the largest difference between the two inputs' logits at the observed
positions, raw and centred, beside the largest |logit|: a near-collision of the model (small in
both spaces) or an artefact of the space (small only in the one searched).

    python benchmarks/false_finds.py /work/results/both-spaces --model ../shared/models/stories260K

One line per false find, then a summary. The model is loaded as the sweep loaded it (`--bos`:
a BOS before the input, as sweeps/both-spaces.yaml; one observed position after the input).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a results folder (searched for Parquet files)")
    p.add_argument("--model", required=True)
    p.add_argument("--no-bos", action="store_true", help="the sweep ran without a BOS")
    args = p.parse_args()
    import pandas as pd
    import torch

    import sodaray

    files = sorted(Path(args.results).rglob("*.parquet"))
    if not files:
        raise SystemExit(f"no Parquet files under {args.results}")
    rows = pd.concat([pd.read_parquet(f) for f in files])
    false = rows[rows["found"] & ~rows["exact"]]
    model = sodaray.load_model(args.model, device="cpu", bos=not args.no_bos)

    def logits(tokens) -> torch.Tensor:
        ids = torch.tensor([list(model.prefix_ids) + [int(t) for t in tokens]])
        with torch.no_grad():
            return model.model(ids).logits[0, -1].double()

    worst = {"raw": 0.0, "centred": 0.0}
    for _, r in false.iterrows():
        a, b = logits(r["true_tokens"]), logits(r["tokens"])
        raw = float((a - b).abs().max())
        centred = float(((a - a.mean()) - (b - b.mean())).abs().max())
        worst = {"raw": max(worst["raw"], raw), "centred": max(worst["centred"], centred)}
        print(
            f"{r['space']:>8} length {r['length']}: true {list(map(int, r['true_tokens']))} "
            f"found {list(map(int, r['tokens']))}: max |diff| raw {raw:.3g}, centred "
            f"{centred:.3g}, max |logit| {float(a.abs().max()):.3g}"
        )
    counts = false.groupby("space").size().to_dict()
    found = rows[rows["found"]].groupby("space").size().to_dict()
    print(
        "false finds per space: "
        + ", ".join(f"{s} {counts.get(s, 0)} of {found.get(s, 0)} found" for s in sorted(found))
        + f"; largest difference raw {worst['raw']:.3g}, centred {worst['centred']:.3g}"
    )


if __name__ == "__main__":
    main()
