"""Decode a data list with an experiment's newest complete checkpoint: CER, WER, hypotheses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .config import load_config
from .data.loader import AsrLoader
from .data.sources import load_sources
from .data.tokenizer import CharTokenizer
from .model import ConformerCTC
from .train import checkpoint, dist
from .train.trainer import evaluate


def load_model(exp: str | Path) -> tuple[ConformerCTC, CharTokenizer, object, dict]:
    """(model in eval mode, tokenizer, config, checkpoint marker) of an experiment."""
    exp = Path(exp)
    cfg = load_config(exp / "config.yaml")
    tok = CharTokenizer.load(exp / "units.txt")
    found = checkpoint.load_latest(exp / "checkpoints")
    if found is None:
        raise FileNotFoundError(f"{exp}: no complete checkpoint to decode with")
    state, marker = found
    model = ConformerCTC(cfg.model, len(tok))
    model.load_state_dict(state["model"])
    return model.eval(), tok, cfg, marker


def decode_exp(exp: str | Path, data: str | Path, name: str | None = None) -> dict:
    """CER/WER over ``data``; hypotheses to ``EXP/decode/<name>.txt`` as ``key<TAB>ref<TAB>hyp``."""
    model, tok, cfg, marker = load_model(exp)
    data_cfg = replace(cfg.data, shuffle=False, spec_augment=False, num_workers=min(cfg.data.num_workers, 1))
    loader = AsrLoader(load_sources(data, data_cfg.raw_chunk), tok, data_cfg)
    info = dist.DistInfo(0, 1, 0, next(model.parameters()).device, None)
    result = evaluate(model, loader, tok, info, keep_hyps=True)
    name = name or Path(data).parent.name or Path(data).stem
    out = Path(exp) / "decode" / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"{k}\t{r}\t{h}\n" for k, r, h in sorted(result.pop("hyps"))))
    return {**result, "data": str(data), "step": marker["step"], "hyps_path": str(out)}
