"""Would a gradient-guided swap (GCG's step) fix a SODA search that ends one token off?

    python benchmarks/gradient_polish.py --results RESULTS_DIR --model MODEL [--name NAME]
        [--length 2] [--top 256] [--threads 1]

Reads a finished sweep's rows (`--results`, e.g. the real-model study's folder) and takes the
failed searches of `--length` whose tokens are right at every position but the first (where
SmolLM2 fails: the input's first token, just after the BOS). At each one's found input it ranks
the true first token under the gradient of the logits loss with respect to that position's
one-hot (0 = the most promising swap), and scores the `--top` candidates by that gradient
exactly (a forward each), as one GCG step would. The loss is the Huber loss (delta 1) over the
last position's raw logits, the default objective; a rank does not depend on its scale.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

import sodaray


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True)
    p.add_argument("--model", required=True, help="the model the rows were searched on")
    p.add_argument("--name", default="smollm2-135m", help="the rows' model_name")
    p.add_argument("--length", type=int, default=2)
    p.add_argument("--top", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = sodaray.load_model(args.model, device="cpu", bos=True)
    embed, prefix = model.embedding_matrix, list(model.prefix_ids)
    rows = pd.read_parquet(args.results)
    rows = rows[rows.model_name.eq(args.name) & rows.length.eq(args.length) & ~rows.exact]
    one_off = [
        (list(map(int, t)), list(map(int, f)))
        for t, f in zip(rows.true_tokens, rows.tokens, strict=True)
        if list(t[1:]) == list(f[1:])
    ]
    print(f"{len(one_off)} of {len(rows)} failures are wrong at the first position only")

    def last_logits(ids: list[list[int]]) -> torch.Tensor:
        with torch.no_grad():
            return model.model(input_ids=torch.tensor([prefix + i for i in ids])).logits[:, -1]

    def huber(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.huber_loss(a, b.expand_as(a), reduction="none").mean(-1)

    ranks = []
    for true, found in one_off:
        target = last_logits([true])[0]
        x = torch.zeros(embed.shape[0])
        x[found[0]] = 1
        x.requires_grad_(True)
        rest = embed[found[1:]]
        inputs = torch.cat([embed[prefix], (x @ embed)[None] * model.embed_scale, rest])[None]
        loss = huber(model.model(inputs_embeds=inputs).logits[0, -1:], target)[0]
        loss.backward()
        order = torch.argsort(x.grad)  # the most negative derivative first
        rank = int((order == true[0]).nonzero().item())
        ranks.append(rank)
        top = order[: args.top].tolist()
        scores = huber(last_logits([[t, *found[1:]] for t in top]), target)
        print(
            f"true {true} found {found}: loss {loss.item():.4f}, the true first token ranks "
            f"{rank} of {embed.shape[0]}; the best of the top {args.top} swaps: "
            f"{scores.min().item():.4f}"
        )
    within = sum(r < args.top for r in ranks)
    print(f"RESULT: {within} of {len(ranks)} true first tokens in the gradient's top {args.top}")


if __name__ == "__main__":
    main()
