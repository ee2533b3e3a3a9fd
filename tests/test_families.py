"""Issue 38: family defaults. A model that names no preset gets its family's (by its config's
`model_type`) through `sodaray invert`, sweeps and tuning; a named preset or a flag wins; a job
equal to one that named the same preset hashes as that job, and the shipped sweeps' and tuning
files' hashes change only where their jobs change."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import SMOLLM, STORIES, one_line_error, tiny_model

from sodaray.cli import main
from sodaray.config.families import FAMILIES, defaults_for, model_type_of
from sodaray.config.presets import PRESETS
from sodaray.objective.objectives import Objective
from sodaray.runner.jobs import plan_jobs
from sodaray.runner.spec import load_sweep
from sodaray.search.soda.config import SodaConfig
from sodaray.tuner import load_tuning
from sodaray.tuner.study import spec_hash

ROOT = Path(__file__).resolve().parents[1]
# kind for `tiny_model` -> (family, its preset, its space)
FAMILY_OF = {
    "llama": ("llama", "qwen2.5-0.5b", "centred"),
    "qwen2": ("qwen2", "qwen2.5-0.5b", "centred"),
    "gemma3": ("gemma3", "qwen2.5-0.5b", "centred"),
    "gpt2": ("gpt2", "gpt2-small", "raw"),
    "gpt-neo": ("gpt-neo", "tinystories-33m", "raw"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each tiny architecture saved as a model folder (config.json and weights, no tokenizer),
    as a user's checkpoint is given to `--model`."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for kind in FAMILY_OF:
        out[kind] = root / kind
        tiny_model(kind).model.save_pretrained(out[kind])
    return out


def invert_json(capsys, model: Path, *extra: str) -> tuple[dict, str]:
    argv = ["invert", "--model", str(model), "--tokens", "1,2", "--max-steps", "2", "--json"]
    assert main([*argv, *extra]) == 0
    out = capsys.readouterr()
    return json.loads(out.out.splitlines()[-1]), out.err


def knobs(params: dict) -> dict:
    return {k: params[k] for k in PRESETS["qwen2.5-0.5b"].soda}


@pytest.mark.parametrize("kind", list(FAMILY_OF))
def test_invert_without_a_preset_gets_the_familys_defaults(kind, folders, capsys):
    family, preset, space = FAMILY_OF[kind]
    row, err = invert_json(capsys, folders[kind])
    assert row["defaults"]["family"] == family and row["defaults"]["preset"] == preset
    assert knobs(row["params"]) == PRESETS[preset].soda  # SODA ran with the family's knobs
    assert row["space"] == space == row["defaults"]["space"]
    assert "family" not in err  # stderr is for errors


def test_a_named_preset_or_a_flag_wins_over_the_family(folders, capsys):
    llama = folders["llama"]
    row, _ = invert_json(capsys, llama, "--preset", "tinystories-33m")
    assert row["defaults"] is None  # a named preset, used alone
    assert (row["space"], row["params"]["learning_rate"]) == ("raw", 0.065)
    row, _ = invert_json(capsys, llama, "--space", "raw", "--param", "temperature=0.1")
    assert row["defaults"]["family"] == "llama" and row["space"] == "raw"
    assert (row["params"]["learning_rate"], row["params"]["temperature"]) == (0.03, 0.1)
    # The family's space is for all logits, where it was measured: top-k keeps raw (and
    # centred top-1, always 0, never comes up).
    for k in ("2", "1"):
        row, _ = invert_json(capsys, llama, "--top-k", k)
        assert row["space"] == "raw" and row["params"]["learning_rate"] == 0.03
    row, _ = invert_json(capsys, llama, "--objective", "text")
    assert row["space"] == "raw" and row["defaults"]["family"] == "llama"


def test_invert_says_which_defaults_and_why_before_its_results(folders, capsys):
    argv = ["invert", "--model", str(folders["llama"]), "--tokens", "1", "--max-steps", "2"]
    assert main(argv) == 0
    first, *_ = capsys.readouterr().out.splitlines()
    assert first.startswith("defaults: no preset named; model_type 'llama' is the llama family")
    assert "preset qwen2.5-0.5b, centred logits" in first
    assert "no BOS before the input" in first  # the family's advice: nothing precedes it here
    assert main([*argv, "--preset", "qwen2.5-0.5b"]) == 0
    assert "defaults" not in capsys.readouterr().out


def test_a_type_outside_every_family_keeps_sodas_own_defaults():
    for kind in ("mistral", None, 5):
        defaults = defaults_for(kind)
        assert defaults.family is None and defaults.params("soda") == {}
        assert defaults.objective({"kind": "logits"}) == {}
        assert "SODA's own" in defaults.why()
    # The paper preset SODA's defaults equal: naming it keeps what no preset got before.
    assert SodaConfig(**PRESETS["tinystories-33m"].soda) == SodaConfig()


def test_every_familys_values_make_a_valid_config_and_objective():
    """Sweeps and tuning files check their own values before the family is read (no model
    file is opened while a file is checked), which holds because every family's are valid."""
    types = [t for f in FAMILIES for t in f.model_types]
    assert len(types) == len(set(types))  # one family per type
    for family in FAMILIES:
        defaults = defaults_for(family.model_types[0])
        SodaConfig(**defaults.params("soda"))
        assert defaults.params("gcg") == {}  # presets hold SODA's knobs only
        for entry in ({"kind": "logits"}, {"kind": "logits", "top_k": 1}, {"kind": "text"}):
            Objective(**{**entry, **defaults.objective(entry)})
        assert set(family.basis) == {"preset", "space", "bos"}


def sweep_file(tmp: Path, name: str, model: dict, objective: dict) -> Path:
    doc = {
        "name": "fam",
        "models": [model],
        "datasets": [{"name": "random", "build": {"dataset": "random", "lengths": "1"}}],
        "algorithms": [{"name": "soda"}],
        "objectives": [objective],
        "samples_per_length": 2,
        "max_steps": 5,
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_a_sweep_entry_without_a_preset_hashes_as_the_preset_it_equals(tmp_path):
    family = sweep_file(tmp_path, "a.yaml", {"id": str(STORIES)}, {"kind": "logits"})
    (job,) = load_sweep(family).jobs()
    assert job.defaults is not None and job.defaults.family.name == "llama"  # stories260K
    assert job.objective.space == "centred"
    assert job.search == SodaConfig(**PRESETS["qwen2.5-0.5b"].soda, max_steps=5)
    named = sweep_file(
        tmp_path,
        "b.yaml",
        {"id": str(STORIES), "preset": "qwen2.5-0.5b"},
        {"kind": "logits", "space": "centred"},
    )
    (same,) = load_sweep(named).jobs()
    assert same.defaults is None
    assert same.name == job.name and same.config_hash == job.config_hash  # one folder
    (plan,) = plan_jobs([job], tmp_path / "out")
    written = json.loads((plan.meta / "job.json").read_text())
    assert written["defaults"]["family"] == "llama" and written["defaults"]["space"] == "centred"
    assert "no preset named" in written["defaults"]["why"]
    # `--model` drops the file's presets: the new model gets its own family's.
    (other,) = load_sweep(named).jobs(model=str(STORIES))
    assert other.defaults.family.name == "llama" and other.config_hash == job.config_hash


def hub_cache(root: Path, types: dict[str, str]) -> Path:
    """A Hugging Face cache holding a `config.json` per repository (the layout the hub library
    writes: refs/main names the snapshot), so hub ids are read offline."""
    commit = "0" * 40
    for repo, kind in types.items():
        entry = root / ("models--" + repo.replace("/", "--"))
        (entry / "refs").mkdir(parents=True)
        (entry / "refs" / "main").write_text(commit)
        (entry / "snapshots" / commit).mkdir(parents=True)
        (entry / "snapshots" / commit / "config.json").write_text(json.dumps({"model_type": kind}))
    return root


# What issue 38 changed, and why: each a job (or study) whose settings changed, since its model
# (stories260K, SmolLM2-135M: Llama; Qwen2.5: Qwen2) names no preset or space and its family
# compares centred logits.
CHANGED = {
    ("sweeps", "quickstart"): "stories260K without a preset: the llama family's knobs, centred",
    ("tuning", "fluency-stories260k"): "stories260K, its objective's space unset: centred",
    ("tuning", "gcg-stories260k"): "stories260K, GCG on logits with no space: centred",
    ("tuning", "smollm2-135m"): "SmolLM2 (Llama), space unset: centred",
    ("tuning", "smollm2-135m-bos"): "SmolLM2 (Llama), space unset: centred",
    ("tuning", "stories260k"): "stories260K, space unset: centred",
    # The confirm in both spaces: their centred jobs now hold a match to the raw logits too.
    ("sweeps", "both-spaces"): "centred jobs confirm raw (raw jobs keep their hashes)",
    ("sweeps", "smollm2-space"): "centred jobs confirm raw (raw jobs keep their hashes)",
    ("tuning", "smollm2-135m-bos-centred"): "space: centred, now confirmed raw too",
    # Qwen2's family space, centred since its lengths 1-3 were measured in both spaces.
    ("tuning", "qwen2.5-0.5b"): "Qwen2.5-0.5B (Qwen2), space unset: centred",
    ("tuning", "qwen2.5-3b"): "Qwen2.5-3B (Qwen2), space unset: centred",
    # `max_length` is read by a length search alone: assumed-length jobs hash the default.
    ("sweeps", "length"): "its max_length: 5, read by none of its assumed-length jobs",
}


@pytest.mark.skipif(not (STORIES.is_dir() and SMOLLM.is_dir()), reason="../shared models absent")
def test_shipped_hashes_change_only_where_the_job_changes(tmp_path, monkeypatch):
    """`tests/shipped_hashes.json` holds every shipped sweep's job hashes and tuning file's study
    hash as computed before family defaults. The real models' files are stood in for by empty
    files (their entries name presets: nothing is read) and the hub ids' configs by a cache."""
    real = tmp_path / "real"
    for name in ("qwen2.5-0.5b", "gemma3-270m"):
        (real / name).mkdir(parents=True)
        (real / name / "model.gguf").write_bytes(b"")
    monkeypatch.setenv("SODARAY_REAL_MODELS", str(real))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = {
        "openai-community/gpt2": "gpt2",
        "openai-community/gpt2-xl": "gpt2",
        "Qwen/Qwen2.5-0.5B": "qwen2",
        "Qwen/Qwen2.5-3B": "qwen2",
        "roneneldan/TinyStories-33M": "gpt_neo",
        "TDC2023/trojan-base-pythia-1.4b-test-phase": "gpt_neox",
    }
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache(tmp_path / "hub", cache)))
    before = json.loads((ROOT / "tests" / "shipped_hashes.json").read_text())
    now: dict[str, dict] = {"sweeps": {}, "tuning": {}}
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        now["sweeps"][path.stem] = {
            j.name.rsplit("-", 1)[0]: j.config_hash for j in load_sweep(path).jobs()
        }
    for path in sorted((ROOT / "tuning").glob("*.yaml")):
        now["tuning"][path.stem] = spec_hash(load_tuning(path))
    assert (
        set(now["sweeps"]) == set(before["sweeps"])
        and now["tuning"].keys() == before["tuning"].keys()
    )
    changed = {("tuning", k) for k, v in now["tuning"].items() if before["tuning"][k] != v}
    changed |= {("sweeps", k) for k, v in now["sweeps"].items() if before["sweeps"][k] != v}
    assert changed == set(CHANGED)
    # Where only the confirm changed a sweep, exactly its centred jobs changed.
    for name in ("both-spaces", "smollm2-space"):
        moved = {j for j, h in now["sweeps"][name].items() if before["sweeps"][name][j] != h}
        assert moved == {j for j in now["sweeps"][name] if "centred" in j}, name
    # The quickstart's jobs changed in what the family sets and nothing else: naming the preset
    # SODA's defaults equal gives back the old jobs, hashes and all.
    kept = load_sweep(
        ROOT / "sweeps" / "quickstart.yaml", overrides=["models.0.preset=tinystories-33m"]
    ).jobs()
    assert {j.name.rsplit("-", 1)[0]: j.config_hash for j in kept} == before["sweeps"]["quickstart"]


def test_model_type_is_read_from_folders_gguf_files_and_the_hub_cache(folders, monkeypatch):
    assert model_type_of(str(folders["qwen2"])) == "qwen2"
    assert model_type_of(str(folders["gemma3"])) == "gemma3_text"
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache(Path(tmp), {"org/m": "qwen2"})))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert model_type_of("org/m") == "qwen2"
        with pytest.raises(ValueError, match="org/absent.*HF_HUB_OFFLINE.*name a preset") as info:
            model_type_of("org/absent")
        assert "\n" not in str(info.value)
        bad = Path(tmp) / "bad"
        bad.mkdir()
        (bad / "config.json").write_text("{not json")
        with pytest.raises(ValueError, match="cannot read the config of"):
            model_type_of(str(bad))
        # GGUF headers: not one, cut short, or a string longer than any key
        header = b"GGUF" + (3).to_bytes(4, "little") + bytes(8)  # version 3, no tensors
        for name, data, message in [
            ("text.gguf", b"hello, not a model", "text.gguf: not a GGUF model file"),
            ("cut.gguf", header + (5).to_bytes(8, "little") + b"\x03", "cut.gguf: GGUF file cut"),
            ("long.gguf", header + bytes([1]) + bytes(7) + (2**62).to_bytes(8, "little"), "of 4,6"),
        ]:
            (Path(tmp) / name).write_bytes(data)
            with pytest.raises(ValueError, match=message):
                model_type_of(str(Path(tmp) / name))
        # A big-endian file: its architecture read as the loader's own check reads the header.
        key, big = b"general.architecture", b"GGUF" + (3).to_bytes(4, "big") + bytes(8)
        big += (1).to_bytes(8, "big") + len(key).to_bytes(8, "big") + key
        (Path(tmp) / "big.gguf").write_bytes(big + (8).to_bytes(4, "big") + bytes(7) + b"\x05qwen2")
        assert model_type_of(str(Path(tmp) / "big.gguf")) == "qwen2"
    gguf = SMOLLM / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        pytest.skip("../shared's SmolLM2 GGUF is absent")
    assert model_type_of(str(gguf)) == "llama"  # its architecture, as transformers loads it
    assert model_type_of(str(SMOLLM), gguf.name) == "llama"


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_a_study_hash_changes_only_where_the_family_changes_a_trial(tmp_path):
    def study(objective: dict, fixed: dict) -> Path:
        doc = {
            "name": "t",
            "model": {"id": str(STORIES)},
            "data": {"build": {"dataset": "random", "lengths": "1", "per_length": 2, "seed": 0}},
            "objective": objective,
            "fixed": fixed,
            "space": {k: {"low": v / 2, "high": v} for k, v in knobs_of_qwen().items()},
            "max_steps": 5,
        }
        path = tmp_path / f"t{len(os.listdir(tmp_path))}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    # Every knob the family sets is searched and the file says its space: nothing changes.
    searched = load_tuning(study({"kind": "logits", "space": "centred"}, {}))
    assert searched.defaults_effect() == {}
    assert searched.config({"learning_rate": 0.05}).learning_rate == 0.05
    # The space left unset: the trials compare centred logits, and the hash says so.
    unset = load_tuning(study({"kind": "logits"}, {}))
    assert unset.defaults_effect() == {"objective": {"space": "centred"}}
    assert unset.objective_for({}).space == "centred"
    assert spec_hash(unset) != spec_hash(searched)


def knobs_of_qwen() -> dict[str, float]:
    return {k: v for k, v in PRESETS["qwen2.5-0.5b"].soda.items() if isinstance(v, float)}


def test_a_hub_model_whose_config_cannot_be_read_is_one_line(tmp_path, monkeypatch, capsys):
    """No preset, so the family's defaults need the config: offline and not cached, the plan
    stops in one line naming the model and the way out; with a preset nothing is read."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    path = sweep_file(tmp_path, "hub.yaml", {"id": "org/not-cached"}, {"kind": "logits"})
    err = one_line_error(["sweep", "plan", str(path), "--no-calibrate"], capsys)
    assert "model not-cached: cannot read the config of org/not-cached" in err
    assert "name a preset" in err
    named = sweep_file(
        tmp_path, "named.yaml", {"id": "org/not-cached", "preset": "qwen2.5-0.5b"}, {}
    )
    assert main(["sweep", "plan", str(named), "--no-calibrate"]) == 0


def test_a_gguf_key_of_many_megabytes_is_skipped_not_copied(tmp_path):
    """The loader's header check reads every key, but compares only short ones: a hostile key of
    32 MiB (a sparse file here) costs no copy of it, and the file is still judged whole."""
    import tracemalloc

    from sodaray.io.modelfiles import check_gguf_file

    long = 32 << 20
    path = tmp_path / "long-key.gguf"
    with open(path, "wb") as f:  # version 3, no tensors, one key: a uint32 after 32 MiB of name
        f.write(b"GGUF" + (3).to_bytes(4, "little") + bytes(8) + (1).to_bytes(8, "little"))
        f.write(long.to_bytes(8, "little"))
        f.seek(long, os.SEEK_CUR)
        f.write((4).to_bytes(4, "little") + bytes(4) + bytes(24))  # to the 32-byte alignment
    tracemalloc.start()
    try:
        assert check_gguf_file(path) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < long // 4, f"{peak:,} bytes allocated reading the header"
    with pytest.raises(ValueError, match="a GGUF header string of 33,554,432 bytes"):
        model_type_of(str(path))  # the family lookup refuses such a key outright
