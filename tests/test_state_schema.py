"""One checkpoint schema, versioned: what the trainer and a user's loop save through the run state, and the
loader's position inside it. Each refuses what it does not understand, and what this release writes loads."""

from __future__ import annotations

import pytest
import torch

from asrlab.data.config import DataConfig
from asrlab.data.loader import STATE_VERSION, AsrLoader
from asrlab.data.sources import load_sources
from asrlab.lab.state import checkpoint
from asrlab.lab.state.run_state import VERSION, upgrade


def _loader(corpus, tok, **kw):
    return AsrLoader(load_sources(str(corpus / "data.list")), tok, DataConfig(max_frames_in_batch=800, **kw))


def test_the_loader_state_carries_its_version_and_refuses_what_it_does_not_understand(corpus, tok):
    loader = _loader(corpus, tok)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["version"] == STATE_VERSION
    for bad, why in (
        ({**state, "version": STATE_VERSION + 1}, "version"),
        ({k: v for k, v in state.items() if k != "positions"}, "positions"),
        ({"position": 3}, "AsrLoader"),
        ([1, 2], "AsrLoader"),
    ):
        with pytest.raises(ValueError, match=why):
            _loader(corpus, tok).load_state_dict(bad)
        with pytest.raises(ValueError, match=why):
            _loader(corpus, tok).load_states([bad])


def test_a_loader_state_saved_before_the_version_was_recorded_still_resumes(corpus, tok):
    loader = _loader(corpus, tok)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    expected = [b["keys"] for b in it]
    old = {k: v for k, v in state.items() if k != "version"}  # as the previous release wrote it
    again = _loader(corpus, tok)
    again.load_state_dict(old)
    assert [b["keys"] for b in again] == expected


def _trainer(corpus, exp, *extra):
    from asrlab.config import load_config
    from asrlab.lab.dist import DistInfo
    from asrlab.train.trainer import Trainer
    from conftest import SMALL

    return Trainer(
        load_config("tiny", SMALL + list(extra)),
        str(corpus / "data.list"),
        None,
        exp,
        DistInfo(0, 1, 0, torch.device("cpu"), None),
    )


def _as_unversioned_trainer_checkpoint(state: dict) -> dict:
    """The same checkpoint in the trainer's unversioned layout: per-rank lists and its counters at the top."""
    old = {k: v for k, v in state.items() if k not in ("version", "ranks", "extra")}
    old["rng"] = [r["rng"] for r in state["ranks"]]
    old["loader"] = [r["loader"] for r in state["ranks"]]
    old.update(state["extra"])
    return old


def test_the_trainer_saves_through_the_run_state_schema_and_an_unversioned_checkpoint_still_resumes(corpus, tmp_path):
    exp = tmp_path / "exp"
    tr = _trainer(corpus, exp, "train.max_steps=3", "train.save_every_steps=3")
    tr.fit()
    tr.close()
    path = exp / "checkpoints" / "step_00000003.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    assert state["version"] == VERSION and len(state["ranks"]) == 1
    assert {"clock", "epoch_done", "skipped"} <= set(state["extra"])
    assert upgrade(state) is state

    resumed = _trainer(corpus, exp, "train.max_steps=5")
    assert resumed.resume() and resumed.step == 3
    expected = [b["keys"] for _, b in zip(range(2), resumed.loader)]
    resumed.close()

    old_state = _as_unversioned_trainer_checkpoint(state)
    old_state["clock"] = {**old_state["clock"], "elapsed_s": 1234.5}  # a value only the checkpoint can give back
    checkpoint.save_checkpoint(path.parent, old_state, 3, {"epoch": state["epoch"]})
    old = _trainer(corpus, exp, "train.max_steps=5")
    assert old.resume() and old.step == 3
    assert 1234.5 <= old.clock.state_dict()["elapsed_s"] < 1300
    assert [b["keys"] for _, b in zip(range(2), old.loader)] == expected
    old.close()


def test_a_checkpoint_of_an_unknown_version_is_refused_with_the_reason(corpus, tmp_path):
    exp = tmp_path / "exp"
    tr = _trainer(corpus, exp, "train.max_steps=2", "train.save_every_steps=2")
    tr.fit()
    tr.close()
    path = exp / "checkpoints" / "step_00000002.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    for bad in ({**state, "version": VERSION + 1}, {"model": state["model"]}):
        checkpoint.save_checkpoint(path.parent, bad, 2, {"epoch": 0})
        with pytest.raises(ValueError, match="version"):
            _trainer(corpus, exp, "train.max_steps=4").resume()
