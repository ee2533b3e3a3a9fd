"""Whether the loss's unembedding may skip its padding on a device (issue 41).

`LoadedModel.unembed` runs the (N, d) x (d, V) product on exactly N rows, not padded ones, only
on a CPU, where each row was measured to keep its bits from `row_rule(device)[0]` rows up at these
shapes. This checks the same on another device: for each shape, precision and row count N, the
forward logits and the input gradient (dlogits @ W, its inner dimension the vocabulary) of the
unpadded product against the padded one, bit for bit. One line per shape and precision:

    python benchmarks/unembed_rows.py --device cuda [--rows 16:700:7]

All lines "equal" would let the unpadded path run on that device too (3 fewer operations a step).
"""

from __future__ import annotations

import argparse

import torch

from sodaray.model.padding import pad_rows, row_rule

SHAPES = {"neo": (768, 50257), "qwen": (896, 151936)}


def compare(d: int, vocab: int, rows: list[int], device: torch.device) -> list[int]:
    """The row counts at which the unpadded product differs from the padded one."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(d, vocab, bias=False).to(device)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, d, generator=gen) * 0.02)
    differ = []
    for n in rows:
        x = torch.randn(n, d, generator=gen).to(device)
        g = torch.randn(n, vocab, generator=gen).to(device)
        outs = []
        for padded in (False, True):
            xi = x.clone().requires_grad_(True)
            logits = head(pad_rows(xi))[:n] if padded else head(xi)
            (grad,) = torch.autograd.grad(logits, xi, g)
            outs.append((logits.detach(), grad))
        if not all(torch.equal(a, b) for a, b in zip(*outs, strict=True)):
            differ.append(n)
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", default="16:700:7", help="start:stop:count (spread evenly)")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    args = parser.parse_args()
    device = torch.device(args.device)
    start, stop, count = (int(v) for v in args.rows.split(":"))
    floor = row_rule(device)[0]  # the fewest rows that keep each row's bits
    rows = sorted(
        {max(floor, round(start + i * (stop - start) / max(count - 1, 1))) for i in range(count)}
    )
    precisions = ["float32", "tf32"] if device.type == "cuda" else ["float32"]
    for shape in args.shape or ["neo", "qwen"]:
        d, vocab = SHAPES[shape]
        for precision in precisions:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            differ = compare(d, vocab, rows, device)
            verdict = "equal" if not differ else f"DIFFER at N={differ}"
            print(
                f"{shape} {precision} {device.type}: rows {rows} "
                f"(invariant_rows {floor}): {verdict}"
            )
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
