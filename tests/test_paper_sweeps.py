"""Every shipped sweep file against the paper's settings, so a later edit cannot drift.

Each test reads a file in sweeps/ with the real loader and checks the jobs it expands to: step
budgets, lengths, grids, weights, models and algorithms, as "GPT, But Backwards" (Skapars et
al., AAAI 2025) and the authors' notebooks report them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import stand_in

from sodaray.data.build import parse_lengths
from sodaray.runner.spec import Job, Sweep, load_sweep

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
PAPER_SWEEPS = ["models", "tradeoff", "fluency", "ablation", "algorithms", "privacy", "length"]


def sweep(name: str) -> Sweep:
    return load_sweep(SWEEPS / f"{name}.yaml")


def lengths(job: Job) -> list[int]:
    assert job.dataset.build is not None
    return parse_lengths(str(job.dataset.build["lengths"]))


def steps_by_algorithm(jobs: list[Job]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for job in jobs:
        out.setdefault(job.algorithm, set()).add(job.search.max_steps)
    return out


@pytest.mark.parametrize("name", PAPER_SWEEPS)
def test_every_paper_sweep_names_its_table_and_sources(name: str) -> None:
    header = [
        line for line in (SWEEPS / f"{name}.yaml").read_text().splitlines() if line.startswith("#")
    ]
    text = "\n".join(header)
    assert "Paper" in text or "paper" in text
    assert "steps" in text.lower()  # the budget and where it comes from


def test_every_shipped_sweep_loads_and_expands() -> None:
    files = sorted(SWEEPS.glob("*.yaml"))
    assert {f.stem for f in files} >= set(PAPER_SWEEPS)
    for f in files:
        assert load_sweep(f, model=stand_in(f)).jobs(), f


def test_models_table_runs_100k_steps_on_lengths_1_to_10() -> None:
    jobs = sweep("models").jobs()
    assert steps_by_algorithm(jobs) == {"soda": {100_000}}
    assert {j.model.preset for j in jobs} == {
        "tinystories-33m",
        "gpt2-small",
        "gpt2-xl",
        "qwen2.5-0.5b",
        "qwen2.5-3b",
    }
    assert all(lengths(j) == list(range(1, 11)) for j in jobs)
    assert all(j.dataset.build and j.dataset.build["per_length"] == 1000 for j in jobs)
    assert {(j.objective.kind, j.objective.top_k, j.objective.output_tokens) for j in jobs} == {
        ("logits", None, 1)
    }


def test_tradeoff_grid_is_the_papers() -> None:
    jobs = sweep("tradeoff").jobs()
    assert steps_by_algorithm(jobs) == {"soda": {1000}}
    assert all(max(lengths(j)) <= 3 for j in jobs)
    outputs = [1, 2, 3, 5, 10, 25, 50, 100]
    logits = {
        (j.objective.top_k, j.objective.output_tokens) for j in jobs if j.objective.kind == "logits"
    }
    assert logits == {(k, m) for k in [1, 2, 3, 5, 10, 25, 50, 100, None] for m in outputs}
    text = sorted(j.objective.output_tokens for j in jobs if j.objective.kind == "text")
    assert text == outputs
    assert all(j.objective.fluency_weight == 0 for j in jobs)


def test_fluency_weight_is_9e_3_with_and_without() -> None:
    jobs = sweep("fluency").jobs()
    weights = Counter(j.objective.fluency_weight for j in jobs)
    assert set(weights) == {0.0, 9e-3}
    assert weights[0.0] == weights[9e-3] == 3  # random, nl-ood, nl-id each way
    assert {j.dataset.name for j in jobs} == {"random", "nl-ood", "nl-id"}
    assert steps_by_algorithm(jobs) == {"soda": {100_000}}


def test_ablation_rows_leave_one_out() -> None:
    jobs = sweep("ablation").jobs()
    switches = ("use_decay", "bias_correction", "use_resets", "use_reinit")
    soda = {"use_decay": True, "bias_correction": False, "use_resets": True, "use_reinit": True}
    rows = {
        j.variant: {k: getattr(j.search, k) for k in switches}
        for j in jobs
        if j.algorithm == "soda"
    }
    diffs = sorted(
        tuple(sorted(k for k in switches if values[k] != soda[k])) for values in rows.values()
    )
    assert diffs == sorted(
        [
            (),  # SODA
            ("use_decay",),
            ("bias_correction",),
            ("use_resets",),
            ("use_reinit",),
            tuple(sorted(switches)),  # plain Adam
        ]
    )
    assert [j.algorithm for j in jobs].count("embedding") == 1
    assert steps_by_algorithm(jobs) == {"soda": {100_000}, "embedding": {100_000}}
    # SODA's row uses SODA's own switch defaults from the preset, not a hand-set copy.
    assert rows["soda"] == soda


def test_algorithms_text_observes_25_tokens_and_gcg_has_equal_time_budget() -> None:
    jobs = sweep("algorithms").jobs()
    assert {j.algorithm for j in jobs} == {"soda", "gcg", "embedding", "inverter"}
    texts = {j.objective.output_tokens for j in jobs if j.objective.kind == "text"}
    assert texts == {25}
    gcg = [j for j in jobs if j.algorithm == "gcg"]
    assert gcg
    assert all(
        (j.search.tokens_per_position, j.search.num_candidates, j.search.max_steps)
        == (128, 700, 700)
        for j in gcg
    )


def test_privacy_is_tinystories_soda_and_gcg_on_lengths_15_to_24() -> None:
    jobs = sweep("privacy").jobs()
    assert {j.model.id for j in jobs} == {"roneneldan/TinyStories-33M"}
    assert {"soda", "gcg"} <= {j.algorithm for j in jobs}
    assert all(lengths(j) == list(range(15, 25)) for j in jobs)
    assert all(j.dataset.build and j.dataset.build["dataset"] == "privacy" for j in jobs)
    assert all(j.dataset.build and j.dataset.build["per_length"] == 500 for j in jobs)


def test_length_table_runs_every_assumed_length_on_every_true_length() -> None:
    jobs = sweep("length").jobs()
    assert sorted(j.length for j in jobs) == ["1", "2", "3", "4", "5"]
    assert all(lengths(j) == [1, 2, 3, 4, 5] for j in jobs)
    assert steps_by_algorithm(jobs) == {"soda": {10_000}}
    assert len({j.config_hash for j in jobs}) == 5  # each assumed length its own results


def test_presets_say_where_paper_and_config_disagree() -> None:
    from sodaray.config.presets import get_preset

    config, paper = get_preset("qwen2.5-3b"), get_preset("qwen2.5-3b-paper")
    assert config.soda["learning_rate"] == 0.03 and "0.3" in config.note
    assert paper.soda["learning_rate"] == 0.3
    assert {k: v for k, v in paper.soda.items() if k != "learning_rate"} == {
        k: v for k, v in config.soda.items() if k != "learning_rate"
    }
    assert get_preset("pythia-1.4b-tdc").hub_id.endswith("test-phase")
    # The models sweep runs the config's value.
    jobs = [j for j in sweep("models").jobs() if j.model.preset == "qwen2.5-3b"]
    assert [j.search.learning_rate for j in jobs] == [0.03]
