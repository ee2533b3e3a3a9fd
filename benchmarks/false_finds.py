"""How far apart are a false find's outputs from the true input's? For each result row that was
found but not exact, the largest difference between the two inputs' logits at the observed
position, raw and centred, beside the largest |logit|, and whether each space's check at the
tolerance (`torch.isclose` logit by logit, atol and rtol 1e-4 by default, as the match check)
accepts the found input: how many of the V logits fall outside it.

    python benchmarks/false_finds.py /work/results/both-spaces \
        --model ../shared/models/stories260K --job stories260K

One line per false find, then a summary. The model is loaded as the sweep loaded it (a BOS
before the input unless --no-bos, as sweeps/both-spaces.yaml; one observed position after the
input). `--job` keeps the rows of jobs whose name contains it (another model's rows must not be
scored with this model's weights).
"""

from __future__ import annotations

import argparse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a results folder (searched for Parquet files)")
    p.add_argument("--model", required=True)
    p.add_argument("--no-bos", action="store_true", help="the sweep ran without a BOS")
    p.add_argument("--job", default="", help="keep the jobs whose name contains this")
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--rtol", type=float, default=1e-4)
    args = p.parse_args()
    import pandas as pd
    import torch

    import sodaray
    from sodaray.results import result_files

    files = result_files(args.results)
    if not files:
        raise SystemExit(f"no Parquet files under {args.results}")
    rows = pd.concat([pd.read_parquet(f) for f in files])
    rows = rows[rows["job"].str.contains(args.job, regex=False)]
    found, exact = rows["found"].fillna(False).astype(bool), rows["exact"].fillna(False)
    false = rows[found & ~exact.astype(bool)]
    model = sodaray.load_model(args.model, device="cpu", bos=not args.no_bos)

    def logits(tokens) -> torch.Tensor:
        ids = torch.tensor([list(model.prefix_ids) + [int(t) for t in tokens]])
        with torch.no_grad():
            return model.model(ids).logits[0, -1].double()

    def outside(true: torch.Tensor, candidate: torch.Tensor) -> int:
        """Logits the check at the tolerance turns down (0: the space's check accepts it)."""
        close = torch.isclose(candidate, true, atol=args.atol, rtol=args.rtol)
        return int((~close).sum())

    worst = {"raw": 0.0, "centred": 0.0}
    rejected = {"raw": 0, "centred": 0}
    for _, r in false.iterrows():
        a, b = logits(r["true_tokens"]), logits(r["tokens"])
        spaces = {"raw": (a, b), "centred": (a - a.mean(), b - b.mean())}
        line = []
        for name, (t, c) in spaces.items():
            diff, out = float((t - c).abs().max()), outside(t, c)
            worst[name] = max(worst[name], diff)
            rejected[name] += out > 0
            line.append(f"{name}: max |diff| {diff:.3g}, {out} of {len(t)} outside")
        print(
            f"{r['space']:>8} length {r['length']}: true {list(map(int, r['true_tokens']))} "
            f"found {list(map(int, r['tokens']))}; max |logit| {float(a.abs().max()):.3g}; "
            + "; ".join(line)
        )
    counts = false.groupby("space").size().to_dict()
    finds = rows[found].groupby("space").size().to_dict()
    print(
        "false finds per space searched: "
        + ", ".join(f"{s} {counts.get(s, 0)} of {finds.get(s, 0)} found" for s in sorted(finds))
        + f"; largest difference raw {worst['raw']:.3g}, centred {worst['centred']:.3g}; "
        + f"of the {len(false)}, the raw check at atol {args.atol:g} rtol {args.rtol:g} turns "
        + f"down {rejected['raw']}, the centred check {rejected['centred']}"
    )


if __name__ == "__main__":
    main()
