"""Decode a data list with an experiment's newest complete checkpoint: CER, WER, hypotheses."""

from __future__ import annotations

from pathlib import Path

import torch

from .lab import layout
from .config import load_config
from .data.loader import AsrLoader
from .data.sources import load_sources, transcripts
from .data.tokenizer import CharTokenizer
from .lexicon import Lexicon, rescore, search
from .model import ConformerCTC
from .scoring import cer, greedy_decode, wer
from .lab.state import checkpoint
from .lab import dist
from .train.evaluate import evaluate
from .errors import UsageError


def load_model(
    exp: str | Path, device: str | torch.device | None = None
) -> tuple[ConformerCTC, CharTokenizer, object, dict]:
    """(model in eval mode on ``device``, tokenizer, config, checkpoint marker) of an experiment.

    ``device`` None: the first GPU if there is one, else the CPU."""
    exp = Path(exp)
    check_exp(exp)
    device = _device(device)
    cfg = load_config(Path(exp) / layout.CONFIG)
    tok = CharTokenizer.load(exp / layout.UNITS)
    found = checkpoint.load_latest(Path(exp) / layout.CHECKPOINTS)
    if found is None:
        raise FileNotFoundError(f"{exp}: no complete checkpoint to decode with")
    state, marker = found
    model = ConformerCTC(cfg.model, len(tok))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), tok, cfg, marker


def check_exp(exp: str | Path) -> None:
    """A ``UsageError`` unless ``exp`` is a run folder (what ``asrlab train`` wrote): its config and units."""
    exp = Path(exp)
    if not exp.is_dir():
        raise UsageError(f"{exp}: no such folder (give the --exp that asrlab train wrote to)")
    for name in (layout.CONFIG, layout.UNITS):
        if not (exp / name).is_file():
            raise UsageError(f"{exp} is not a run folder: it has no {name} (asrlab train writes one)")


def _device(name: str | torch.device | None) -> torch.device:
    """``name`` as a device this machine has; None: the first GPU if there is one, else the CPU."""
    if name is None:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"device {name!r} is not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"device {name!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def eval_loader(cfg, tok: CharTokenizer, data: str | Path, speed: float = 1.0) -> AsrLoader:
    """``data`` in order, without augmentation, played ``speed`` times faster, batched as the experiment's
    config says."""
    data_cfg = cfg.data.for_eval(num_workers=min(cfg.data.num_workers, 1), speed=speed)
    return AsrLoader(load_sources(data, data_cfg.raw_chunk), tok, data_cfg)


def local(model) -> dist.DistInfo:
    """A single process on the model's device."""
    return dist.DistInfo(0, 1, 0, next(model.parameters()).device, None)


def lexicon_of(data: str | Path) -> Lexicon:
    """The words and word trigram of a data list's transcripts (usually train's)."""
    return Lexicon.from_texts(transcripts(load_sources(data)))


class GreedyKeepingLogProbs:
    """``evaluate``'s decoder: greedy hypotheses, keeping each utterance's (T', V) log-probs
    (``.kept``, in order) for a search afterwards, so the model runs once for both."""

    def __init__(self, tok: CharTokenizer):
        self.tok, self.kept = tok, []

    def __call__(self, log_probs, out_lens) -> list[str]:
        lp = log_probs.float().cpu().numpy()
        self.kept.extend(lp[b, :n] for b, n in enumerate(out_lens.tolist()))
        return [self.tok.decode(ids) for ids in greedy_decode(log_probs, out_lens)]

    def by_key(self, rows) -> dict:
        """``{key: log-probs}``, given ``evaluate``'s ``(key, ref, hyp)`` rows of the same pass."""
        return {key: lp for (key, _, _), lp in zip(rows, self.kept)}


def _write_hyps(path: Path, rows) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}\t{r}\t{h}\n" for k, r, h in sorted(rows)))
    return str(path)


def read_hyps(path: str | Path) -> dict[str, tuple[str, str]]:
    """``{key: (ref, hyp)}`` of a hypotheses file :func:`decode_exp` wrote."""
    out = {}
    for line in Path(path).read_text().splitlines():
        key, ref, hyp = (line.split("\t") + ["", ""])[:3]
        out[key] = (ref, hyp)
    return out


def _log_probs(model, tok: CharTokenizer, cfg, data: str | Path, speed: float) -> dict:
    """``{key: (T', V) log-probs}`` of ``data`` played ``speed`` times faster."""
    kept = GreedyKeepingLogProbs(tok)
    rows = evaluate(model, eval_loader(cfg, tok, data, speed), tok, local(model), keep_hyps=True, decoder=kept)["hyps"]
    return kept.by_key(rows)


def decode_exp(
    exp: str | Path,
    data: str | Path,
    name: str | None = None,
    lexicon_from: str | Path | None = None,
    beam: int = 32,
    lm_weight: float = 1.0,
    word_bonus: float = 3.0,
    speeds=(1.0,),
    device: str | torch.device | None = None,
    progress=None,
) -> dict:
    """Greedy CER/WER over ``data``; hypotheses to ``EXP/decode/<name>.txt`` (``key<TAB>ref<TAB>hyp``).

    With ``lexicon_from`` (a data list, usually train's), also the lexicon beam search over the same
    log-probs (``asrlab.lexicon``: the words and word trigram of its transcripts; beam, LM weight
    and word bonus as chosen on dev by ``benchmarks/lexicon_decode.py``): ``result["lexicon"]`` with its CER, WER
    and ``<name>_lexicon.txt``. With several ``speeds`` (test-time warps, e.g. ``(0.9, 1.0, 1.1)``), the search runs
    on the audio played at each, and ``lexicon.rescore`` picks among the results over all of them; greedy
    decoding stays at speed 1. The model runs on ``device`` (None: the first GPU if there is one), in fp32.
    ``progress``: a function making a tqdm-like bar from ``total``, ``desc`` and ``unit``, for the search."""
    if tuple(speeds) != (1.0,) and lexicon_from is None:
        raise UsageError("decoding at several speeds rescores the lexicon search's results: give a lexicon too")
    model, tok, cfg, marker = load_model(exp, device)
    for speed in speeds:  # a bad speed is data.speed's error, before any decoding
        cfg.data.for_eval(speed=speed)
    greedy = GreedyKeepingLogProbs(tok) if lexicon_from is not None else None  # plain greedy keeps nothing
    result = evaluate(model, eval_loader(cfg, tok, data), tok, local(model), keep_hyps=True, decoder=greedy)
    rows = result.pop("hyps")
    name = name or Path(data).parent.name or Path(data).stem
    out = Path(exp) / "decode"
    result.update(data=str(data), step=marker["step"], hyps_path=_write_hyps(out / f"{name}.txt", rows))
    if lexicon_from is not None:
        lex = lexicon_of(lexicon_from)
        by_speed = {1.0: greedy.by_key(rows)}
        for speed in speeds:
            if speed not in by_speed:
                by_speed[speed] = _log_probs(model, tok, cfg, data, speed)
        hyps = []
        bar = progress(total=len(rows), desc=f"lexicon search, {name}", unit="utt") if progress else None
        for key, _, _ in rows:
            views = [by_speed[s][key] for s in speeds if key in by_speed[s]] or [by_speed[1.0][key]]
            found = [search(lp, tok.units, lex, beam, lm_weight, word_bonus) for lp in views]
            hyps.append(found[0] if len(views) == 1 else rescore(views, found, tok.units, lex, lm_weight, word_bonus))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        refs = [ref for _, ref, _ in rows]
        result["lexicon"] = {
            "cer": cer(refs, hyps),
            "wer": wer(refs, hyps),
            "beam": beam,
            "lm_weight": lm_weight,
            "word_bonus": word_bonus,
            "speeds": list(speeds),
            "hyps_path": _write_hyps(out / f"{name}_lexicon.txt", [(k, r, h) for (k, r, _), h in zip(rows, hyps)]),
        }
    return result
