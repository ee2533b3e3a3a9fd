"""What a SODA step costs when it is one static-shape CUDA graph (issue 41's executor, measured
before it is built into the engine), beside the same step run eagerly, and where the eager
engine's step spends its GPU time.

    # on a GPU machine, after `source .device/setup.sh`:
    python3 benchmarks/graph_step.py --device cuda
    python benchmarks/graph_step.py --device cpu --case stories:3:4   # the eager form, here

A "step" here is the engine's arithmetic without its bookkeeping: softmax(Z / tau) @ E as
inputs_embeds, the transformer, the last input position's logits against a fixed target
distribution (KL), the gradient to Z, Adam without bias correction, decay, and the argmax
tokens, all on static tensors (Z, m, v, the target) so that `torch.cuda.graph` can capture it
once and replay it. `--profile` also prints the top kernels of `sodaray.invert`'s own step
(torch.profiler, CUDA time per step) for each case. One line per case and precision:
eager ms/step, whether a second eager run ends on the same tokens (SDPA's backward and cuBLAS
may not be deterministic on a GPU), graphed ms/step, their ratio, and whether the graph's
tokens after `--steps` steps equal the eager run's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def decoder(hf):
    """The transformer without its head: final hidden states (B, L, d)."""
    for name in ("model", "transformer"):
        inner = getattr(hf, name, None)
        if inner is not None:
            return inner
    raise SystemExit("no decoder found")


def make_step(hf, n: int, batch: int, precision: str, device: str, full: bool = False):
    """The static tensors and one step's function over them. `full` adds what issue 52's whole
    step must carry on the device: per-slot hyperparameters as tensors, an on-device step count
    with Adam's bias correction, a temperature schedule, and a status tensor (tokens changed and
    loss per search) written for the host to copy out asynchronously."""
    import torch

    vocab = hf.get_input_embeddings().weight.shape[0]
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    run = hf if dtype == torch.float32 else _bf16_copy(hf)
    emb = run.get_input_embeddings().weight.detach()
    head = run.get_output_embeddings().weight.detach()
    body = decoder(run)
    gen = torch.Generator(device="cpu").manual_seed(3)
    rows = batch * n
    state = {
        "z": torch.zeros(rows, vocab, device=device),
        "m": torch.zeros(rows, vocab, device=device),
        "v": torch.zeros(rows, vocab, device=device),
        "target": torch.softmax(torch.randn(batch, vocab, generator=gen), -1).to(device),
        "tokens": torch.zeros(rows, dtype=torch.long, device=device),
        "t": torch.zeros((), device=device),
        "lr": torch.full((rows, 1), 0.065, device=device),
        "tau": torch.full((rows, 1), 0.05, device=device),
        "status": torch.zeros(batch, 2, device=device),
    }
    lr, b1, b2, eps, tau, decay = 0.065, 0.9, 0.995, 1e-8, 0.05, 0.9

    def step() -> None:
        z = state["z"].detach().requires_grad_(True)
        temp = state["tau"] * (0.999 ** state["t"]) if full else tau
        with torch.enable_grad():
            probs = torch.softmax(z / temp, -1).to(dtype)
            x = (probs @ emb).view(batch, n, -1)
            hidden = body(inputs_embeds=x, use_cache=False).last_hidden_state[:, -1]
            logp = torch.log_softmax((hidden @ head.T).float(), -1)
            per = torch.nn.functional.kl_div(logp, state["target"], reduction="none").sum(-1)
            (grad,) = torch.autograd.grad(per.sum(), z)
        with torch.no_grad():
            state["m"].lerp_(grad, 1 - b1)
            state["v"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
            if full:
                state["t"].add_(1)
                c1 = 1 - b1 ** state["t"]
                c2 = (1 - b2 ** state["t"]).sqrt()
                denom = (state["v"].sqrt() / c2).add_(eps)
                state["z"].sub_(state["m"] / denom * (state["lr"] / c1))
            else:
                state["z"].addcdiv_(state["m"], state["v"].sqrt().add_(eps), value=-lr)
            state["z"].mul_(decay)
            if full:
                new = torch.argmax(state["z"], -1)
                changed = (new != state["tokens"]).view(batch, n).sum(-1)
                state["tokens"].copy_(new)
                state["status"][:, 0].copy_(changed)
                state["status"][:, 1].copy_(per.detach())
            else:
                torch.argmax(state["z"], -1, out=state["tokens"])

    return state, step


_COPIES: dict[int, object] = {}


def _bf16_copy(hf):
    import copy

    import torch

    key = id(hf)
    if key not in _COPIES:
        _COPIES[key] = copy.deepcopy(hf).to(torch.bfloat16)
    return _COPIES[key]


def timed(fn, steps: int, cuda: bool) -> float:
    """Seconds per call of `fn`, over `steps` calls (CUDA events on a GPU)."""
    import torch

    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def reset(state) -> None:
    for key in ("z", "m", "v", "t"):
        state[key].zero_()


def graph_case(model, spec: str, precision: str, steps: int, device: str, full: bool) -> str:
    import torch

    _, n, batch = spec.split(":")
    n, batch = int(n), int(batch)
    cuda = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    hf = model.model
    state, step = make_step(hf, n, batch, precision, device, full)
    for _ in range(3):
        step()
    reset(state)
    eager = timed(step, steps, cuda)
    eager_tokens = state["tokens"].clone()
    reset(state)
    timed(step, steps, cuda)  # again: is the eager step itself repeatable here?
    again = bool(torch.equal(state["tokens"], eager_tokens))
    kind = "full" if full else "bare"
    line = (
        f"{spec:>14} {precision:<8} {kind} eager {1000 * eager:8.2f} ms/step (repeat same: {again})"
    )
    if not cuda:
        return line + "  (no CUDA: no graph)"
    reset(state)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on a side stream, as capture requires
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    except Exception as exc:  # report and go on: this is a measurement, not the product
        return line + f"  graph capture FAILED: {type(exc).__name__}: {str(exc)[:200]}"
    reset(state)
    graphed = timed(graph.replay, steps, cuda)
    same = bool(torch.equal(state["tokens"], eager_tokens))
    graph_tokens = state["tokens"].clone()
    reset(state)
    timed(graph.replay, steps, cuda)  # a replayed search run twice: the same tokens?
    replay_again = bool(torch.equal(state["tokens"], graph_tokens))
    return line + (
        f"  graphed {1000 * graphed:8.2f} ms/step  x{eager / graphed:.2f}  "
        f"same tokens as eager after {steps} steps: {same}; replay repeat same: {replay_again}"
    )


def profile_case(model, spec: str, precision: str, steps: int, device: str) -> str:
    """The top kernels of `sodaray.invert`'s own steps, CUDA (or CPU) time per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import sodaray

    _, n, batch = spec.split(":")
    n, batch = int(n), int(batch)
    torch.manual_seed(1)
    tokens = torch.randint(0, model.vocab_size, (batch, n)).tolist()
    targets = sodaray.make_targets(model, tokens)

    def run(k: int) -> None:
        config = sodaray.SodaConfig.from_preset(
            "tinystories-33m", max_steps=k, max_batch_size=batch, precision=precision
        )
        sodaray.invert(model, targets, config)

    run(2)
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run(steps)
    if cuda:  # the kernels themselves: CPU-side spans would count their kernels again
        from collections import defaultdict

        from torch.autograd import DeviceType

        times: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:
                times[e.name] += e.time_range.elapsed_us()
                counts[e.name] += 1
        rows = [(name, t, counts[name]) for name, t in times.items()]
    else:
        rows = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()]
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: r[1], reverse=True)
    total = sum(t for _, t, _ in rows)
    unit = "kernels" if cuda else "CPU ops"
    out = [f"# top {unit} {spec} {precision}: {total / steps / 1000:.1f} ms of {unit} per step"]
    for name, t, count in rows[:12]:
        out.append(
            f"#   {t / steps / 1000:7.2f} ms/step {count / steps:6.1f}x  "
            f"{100 * t / total:5.1f}%  {name[:110]}"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--case", action="append", help="model:n:B (repeatable)")
    p.add_argument("--precision", action="append", choices=("float32", "tf32", "bfloat16"))
    p.add_argument(
        "--full",
        action="store_true",
        help="the step with issue 52's on-device state (bias correction, schedule, status)",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    import torch
    from bench_invert import build_model

    cases = args.case or ["neo:10:64", "neo:10:1000", "qwen:3:64", "qwen:3:256", "qwen:3:1000"]
    precisions = args.precision or ["float32", "bfloat16"]
    if args.device.startswith("cuda"):
        print(f"# graph_step on {torch.cuda.get_device_name()} torch {torch.__version__}")
    current = None
    for spec in cases:
        name = spec.split(":")[0]
        if current is None or current[0] != name:
            current = None  # the last model goes before the next one is built
            _COPIES.clear()
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            try:
                current = (name, build_model(name, args.device, "float32"))
            except (Exception, SystemExit) as exc:  # one case lost, not the rest
                print(f"{spec:>14} model FAILED: {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
        for precision in precisions:
            try:
                line = graph_case(current[1], spec, precision, args.steps, args.device, args.full)
                print(line, flush=True)
            except Exception as exc:
                print(f"{spec:>14} {precision:<8} FAILED: {type(exc).__name__}: {exc}"[:300])
            if args.profile:
                try:
                    print(profile_case(current[1], spec, precision, 5, args.device), flush=True)
                except Exception as exc:
                    print(f"# profile {spec} FAILED: {type(exc).__name__}: {exc}"[:300])
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
