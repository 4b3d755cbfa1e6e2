"""One checkpoint schema, versioned: what the trainer and a user's loop save through the run state, and the
loader's position inside it. Each refuses what it does not understand, and what this release writes loads."""

from __future__ import annotations

import pytest

from asrlab.data.config import DataConfig
from asrlab.data.loader import STATE_VERSION, AsrLoader
from asrlab.data.sources import load_sources


def _loader(corpus, tok, **kw):
    return AsrLoader(load_sources(str(corpus / "data.list")), tok, DataConfig(max_frames_in_batch=800, **kw))


def test_the_loader_state_carries_its_version_and_refuses_what_it_does_not_understand(corpus, tok):
    loader = _loader(corpus, tok)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["version"] == STATE_VERSION
    for bad, why in (({**state, "version": STATE_VERSION + 1}, "version"),
                     ({k: v for k, v in state.items() if k != "positions"}, "positions"),
                     ({"position": 3}, "AsrLoader"), ([1, 2], "AsrLoader")):
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
