"""Shared fixtures: tiny random models built from configs, and the real stories260K model."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import sodaray

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
STORIES = SHARED / "models" / "stories260K"
SMOLLM = SHARED / "models" / "smollm2-135m-instruct-q4_1"

torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(config, items) -> None:
    """`cuda`-marked tests need a CUDA GPU: skipped, and said so, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs it)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def one_line_error(args: list[str], capsys) -> str:
    """Run the CLI on `args` and return its stderr, which must be one line, with exit code 2
    and no traceback (argparse's own errors count: they exit through SystemExit)."""
    from sodaray.cli import main

    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def cli_outcome(argv: list[str], capsys, seconds: int) -> tuple[int, str, list[str]]:
    """Run the CLI in this process on `argv`, ended by SIGALRM after `seconds` (an open of a
    FIFO waits for a writer; a parse may never end): its exit code, its stderr, and how it
    broke the rule for hostile input (exit 0, or 2 with one line on stderr; never a
    traceback), [] where it kept it."""
    import signal

    from sodaray.cli import main

    def hung(*_):
        raise TimeoutError(f"{' '.join(argv)[:200]} took more than {seconds}s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    broken = []
    if code not in (0, 2) or "Traceback" in err:
        broken.append(f"exit {code}: {err[-300:]!r}")
    if code == 2 and len(err.strip().splitlines()) != 1:
        broken.append(f"not one line: {err[-300:]!r}")
    return code, err, broken


def finish_all(plans) -> None:
    """Compute every pending shard of sweep `plans` in this process (a real replica worker on
    stories260K, no Ray) and write each file as the driver does."""
    from sodaray.experiment.replica import ReplicaWorker
    from sodaray.experiment.spec import ModelSpec
    from sodaray.results import write_table_atomic
    from sodaray.runner.layout import shard_path
    from sodaray.runner.run import shard_unit

    worker = ReplicaWorker(ModelSpec(str(STORIES)), 1)
    try:
        for plan in plans:
            for i in plan.pending:
                *_, out = worker.run(shard_unit(plan, i))
                write_table_atomic(out.table, shard_path(plan.folder, i))
    finally:
        worker.stop()


@contextlib.contextmanager
def silent_port():
    """A port that accepts connections and never answers (a firewall's tarpit, a wrong port)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@contextlib.contextmanager
def another_driver(folder: Path):
    """A second live process that holds the job lock in `folder` as a sweep driver does (it
    takes it with `acquire_lock`), until the block ends; yields its pid."""
    code = (
        "import sys, time; from pathlib import Path; "
        "from sodaray.runner.layout import acquire_lock; "
        "assert acquire_lock(Path(sys.argv[1])) is None; print('held', flush=True); "
        "time.sleep(300)"
    )
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def tiny_model(
    kind: str, vocab: int = 64, seed: int = 0, attention: str | None = None
) -> sodaray.LoadedModel:
    """A randomly initialised model of the given family, small enough for unit tests
    (`attention`: an attention implementation other than the family's default)."""
    from transformers import (
        AutoModelForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPTNeoConfig,
        LlamaConfig,
        Qwen2Config,
    )

    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    elif kind == "gpt-neo":
        cfg = GPTNeoConfig(
            vocab_size=vocab,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            attention_types=[[["global", "local"], 1]],
            window_size=16,
            max_position_embeddings=64,
        )
    elif kind == "llama":
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
    elif kind == "qwen2":
        cfg = Qwen2Config(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    elif kind == "gemma3":  # scales its input embeddings by sqrt(d) inside the lookup
        cfg = Gemma3TextConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            sliding_window=16,
        )
    else:
        raise ValueError(kind)
    # Wider initialisation so distinct inputs give clearly distinct logits.
    cfg.initializer_range = 0.3
    cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = None
    extra = {} if attention is None else {"attn_implementation": attention}
    model = AutoModelForCausalLM.from_config(cfg, **extra)
    return sodaray.wrap_model(model, None, name=f"tiny-{kind}")


@pytest.fixture(scope="session")
def stories() -> sodaray.LoadedModel:
    if not STORIES.is_dir():
        pytest.skip("../shared/models/stories260K is not present")
    return sodaray.load_model(str(STORIES), device="cpu")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test, restored after: on a busy 2-core machine two threads
    contend with other work and small matrices run an order of magnitude slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_llama() -> sodaray.LoadedModel:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray instance with 2 CPUs, shared by one test module: a fresh one, never a
    cluster another `ray start` on this machine recorded."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def real_models_missing(sweep_file: Path) -> bool:
    """Whether a shipped sweep names the real models ($SODARAY_REAL_MODELS, assembled by
    `../shared/models/fetch-real-models.sh`) and they are not on this machine."""
    real = Path(os.environ.get("SODARAY_REAL_MODELS", "/nonexistent"))
    names_them = "$SODARAY_REAL_MODELS" in sweep_file.read_text()
    return names_them and not (real / "qwen2.5-0.5b" / "model.gguf").is_file()


def stand_in(sweep_file: Path) -> str | None:
    """`--model` for a shipped sweep whose models are not on this machine (the real-model study
    and its held-out check): its file is still checked, on stories260K. None: the file's own
    models."""
    return str(STORIES) if real_models_missing(sweep_file) else None
