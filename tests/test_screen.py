"""The match check's screen, a step behind the step, on the searches whose tokens changed
(`sodaray.search.soda.screen`, issue 52): which slots changed, the captured screens' sizes, and that
screening only the changed ones finds every match at the step that made it, as screening every
slot every step does (same tokens, finds, steps and losses, bit for bit on one thread)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model

import sodaray
import sodaray.search.soda.batch as soda
from sodaray.search.engine.loop import Engine
from sodaray.search.engine.scheduler import CAPTURE_SHAPES
from sodaray.search.engine.scheduler import static_screen as screen_rows
from sodaray.search.engine.work import Work
from sodaray.search.soda.screen import Screener, changed_slots

MIN_ROWS = CAPTURE_SHAPES.min_screen


def test_changed_slots_line_up_rows_by_position_or_by_slot_id():
    ids, row_slot, offset = np.array([10, 11, 12]), np.array([0, 1, 1, 2]), np.array([0, 0, 1, 0])
    tokens = np.array([5, 6, 7, 8])
    assert changed_slots(ids, row_slot, offset, tokens, None).all()  # the first step: all new
    before = (ids, row_slot, offset, tokens.copy())
    same = changed_slots(ids, row_slot, offset, tokens, before)
    assert same.tolist() == [False, False, False]
    moved = tokens.copy()
    moved[2] = 9  # slot 1's second token
    assert changed_slots(ids, row_slot, offset, moved, before).tolist() == [False, True, False]
    # Slot 11 left, 12 moved into its place, 13 came: rows are matched by (slot id, offset).
    ids2, slot2, offset2 = np.array([10, 12, 13]), np.array([0, 1, 2, 2]), np.array([0, 0, 0, 1])
    kept = np.array([5, 8, 1, 2])
    assert changed_slots(ids2, slot2, offset2, kept, before).tolist() == [False, False, True]
    kept[1] = 3  # slot 12's token changed too
    assert changed_slots(ids2, slot2, offset2, kept, before).tolist() == [False, True, True]
    # Keys hold any offset: a slot's row 70,000 is not its neighbour's row 0.
    long = (np.array([1, 2]), np.array([0, 1]), np.array([70_000, 0]), np.array([4, 4]))
    moved_in = (np.array([2, 1]), np.array([0, 1]), np.array([0, 70_000]), np.array([4, 5]))
    assert changed_slots(*moved_in, long).tolist() == [False, True]


def test_captured_screen_sizes_are_few_and_waste_at_most_a_quarter():
    sizes = [screen_rows(c) for c in range(1, 1025)]
    assert sizes[:MIN_ROWS] == [MIN_ROWS] * MIN_ROWS
    assert all(c <= s for c, s in zip(range(1, 1025), sizes, strict=True))
    assert all(s <= max(MIN_ROWS, 1.25 * c) for c, s in zip(range(1, 1025), sizes, strict=True))
    assert sizes == sorted(sizes) and screen_rows(64) == 64 and screen_rows(65) == 80
    assert len(set(sizes[:64])) == 13  # a batch of 64 slots: at most 13 screen captures


def run(model, works_of, monkeypatch, screen_all: bool):
    """Each work's outcomes, and the slots screened, in one engine; `screen_all`: every slot
    screened at every step (what the check did before it screened only changed tokens)."""
    screened: list[int] = []
    real = Screener.launch

    def counted(self, owner, picks, *args):
        screened.append(len(picks))
        return real(self, owner, picks, *args)

    monkeypatch.setattr(Screener, "launch", counted)
    if screen_all:
        monkeypatch.setattr(soda, "changed_slots", lambda ids, *a: np.ones(len(ids), dtype=bool))
    engine = Engine(model)
    works = works_of()
    for work in works:
        engine.submit(work)
    engine.run()
    monkeypatch.undo()
    outcomes = [
        [(r.tokens, r.found, r.steps, float(r.final_loss).hex()) for r in w.ordered()]
        for w in works
    ]
    return outcomes, sum(screened)


@pytest.mark.parametrize("groups", [1, 2], ids=["one-objective", "two-objectives"])
def test_screening_changed_tokens_finds_what_screening_every_slot_does(
    one_thread, monkeypatch, groups
):
    """The same finds at the same steps, the same tokens and losses, for fewer slots screened;
    with two objectives in one batch too (each slot screened under its own). A screen that
    skipped changed tokens would lose finds: the last run shows this test sees that."""
    model = tiny_model("gpt2")
    rng = np.random.default_rng(5)
    tokens = [list(map(int, rng.integers(0, model.vocab_size, 1 + i % 3))) for i in range(8)]
    objectives = [sodaray.Objective(), sodaray.Objective(space="centred", loss="mse")][:groups]

    def works_of():
        works = []
        for i, objective in enumerate(objectives):
            targets = sodaray.make_targets(model, tokens, objective=objective)
            cfg = sodaray.SodaConfig(max_steps=60, seed=i, max_batch_size=16)
            works.append(Work(targets, cfg, [(len(t),) for t in tokens]))
        return works

    changed, fewer = run(model, works_of, monkeypatch, screen_all=False)
    every, total = run(model, works_of, monkeypatch, screen_all=True)
    assert changed == every
    assert fewer < total
    finds = [o[1] for outcome in changed for o in outcome]
    assert any(finds) and not all(finds)
    # A mutant that screens only a slot's first step: finds are lost, and the check says so.
    first_only = lambda ids, rs, ro, t, before: np.full(len(ids), before is None)  # noqa: E731
    monkeypatch.setattr(soda, "changed_slots", first_only)
    engine = Engine(model)
    lost = works_of()
    for work in lost:
        engine.submit(work)
    engine.run()
    assert sum(r.found for w in lost for r in w.results.values()) < sum(finds)
