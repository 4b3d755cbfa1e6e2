"""Where a line says it is in training, whatever its format: the step a counter names (``step 40``,
``Iteration: 2933``, ``iteration=0``), else a bar's count (``450/1000``, ``[24289/24290]``)."""

from __future__ import annotations

import re

NAMED = re.compile(
    r"(?<![A-Za-z0-9])(?:global[_ ]?step|total[_ ]?step|step|iter(?:ation)?|itr|num_updates|batch|tick)\b['\"]?\W{0,3}(\d+)\b"
    r"(?!\.\d)(?!\s*/\s*\d)(?!\s*->)"  # not "STEP: 10/13" (the place in an epoch) nor "(batch 32 -> 30)" (a size)
    # chainer's "500 iter, 0 epoch", "0 completed epochs, 100 batches"; not "09:30:39 iter 2920" nor "600/ 3515 batches"
    r"|(?<![\w.:=/])(?<!/ )(\d+) (?:iter(?:ation)?s?|batches|updates)\b(?!/)(?!\s+\d)"
    r"|(?<![A-Za-z0-9_])(?:it|i|upd)\s*=\s*(\d+)\b(?!\.\d)(?!\s*/\s*\d)"  # a loop's own "it=00083", "i=0011"
    # ("it=130/200": the epoch's)
    r"|^tick (\d+)\s+kimg\b"  # StyleGAN's "tick 6     kimg 24.0      time 2h 42m 11s"
    r"|\(Steps: (\d+)\)"  # ParallelWaveGAN's trainer: "(Steps: 1000) train/generator_loss = 2.16."
    r"|Saving checkpoints for (\d+) into "  # TensorFlow's estimator: its global step at the save
    r"|^#(\d{3,}): (?=\w+=)"  # Calamari's "#00000010: loss=336.84 ler=1.15 dt=4.88s"
    # an epoch's header over its values a line each: "--- epoch 43 ---", "Epoch [20/20]"
    r"|^\s*[-=*#]{2,} ?epoch (\d+) ?[-=*#]{2,}\s*$|^\s*Epoch \[(\d+)/\d+\]\s*$",
    re.I,
)
# a bar's "450/1000" or "[24289/24290]"; not icefall's "(2/4)" (a rank of a world) nor a date ("06/26 18:54:31")
_OF = re.compile(r"\[(\d+)\s*/\s*\d+\]|(?<![\d.:/(])(\d+)/\d+(?![\d.:/)])(?!\s+\d\d?:\d\d)")

# a tqdm count: "450/1000 [01:23<...", or of a bar with no total: "600it [11:53, 1.19s/it"; a bar drawn without
# tqdm's brackets: "━━━━━━ 588/588 3.6it/s 2:45" (Ultralytics')
_TQDM = re.compile(
    r"(?<![\d.])(?:(\d+)/(?:\d+|\?)\s*|(\d+)it )\[(?:\d+:)?\d+:\d+|(?<![\d.])(\d+)/\d+ [\d.]+(?:it/s|s/it) \d"
)


def bar_count(line: str) -> int | None:
    """The count of a tqdm bar anywhere in a line (glued to other output, its glyphs stripped by a notebook)."""
    m = _TQDM.search(line)
    return int(m.group(1) or m.group(2) or m.group(3)) if m else None


# "step 683/3710": a step of the run's total, where no other counter is named beside it
_STEP_OF = re.compile(r"(?<![A-Za-z0-9])(?:step|iter(?:ation)?)\s*[:=]?\s*(\d+)\s*/\s*\d+", re.I)


def counter_of(line: str, named: bool = False) -> int | None:
    """The step a line names (``step 40``, ``Iteration: 2933``, ``batch 511``), else (not ``named``) a bar's
    (``[24289/24290]``, ``450/1000``); None where it names none."""
    # a tqdm count before any other N/M: a bar's "0/299 ... 34/54 [00:42<00:25" counts batches, its 0/299 epochs
    m = NAMED.search(line) or (_STEP_OF.search(line) if named else _TQDM.search(line) or _OF.search(line))
    return int(next(g for g in m.groups() if g is not None)) if m else None


def batch_beside(d: dict, counter) -> int | None:
    """A batch's own field (``d``: a line's fields) beside the step ``counter`` found ("tick=21 batch=0"): the place
    in the epoch; where the batch is the one counter, it is the step."""
    b = d.get("batch") or d.get("batch_idx") or ""
    return int(b) if b.isdigit() and counter and not counter.group(0).lower().startswith("batch") else None


# a loop's own compact tags of its place, a letter or two and a number each, bracketed or joined by |, :, a comma
# or a space ("[E00|S0015|b015|r1]", "ep0:bt015", "r1 e0 i3/8"): E/ep the epoch, S/st/it/i/u the step (with a
# total beside an epoch, "i3/8", the batch of the epoch), b/bt the batch, r/w/rk the rank
_TAGS = re.compile(
    r"(?:^|(?<=[\[<(«\s]))((?:[A-Za-z]{1,2}\d+(?:/\d+)?[|:/, ·]){1,3}[A-Za-z]{1,2}\d+(?:/\d+)?)(?=[\]>)»\s]|$)"
)
_TAG = re.compile(r"([A-Za-z]{1,2})(\d+)(/\d+)?")
_TAG_FIELDS = {"e": "epoch", "ep": "epoch", "s": "step", "st": "step", "it": "step", "i": "step", "u": "step",
               "b": "batch", "bt": "batch", "r": "rank", "w": "rank", "rk": "rank"}  # fmt: skip


def tags_of(line: str) -> dict:
    """``{"epoch", "step", "batch", "rank"}`` (those said) of a line's compact place tags; {} where it has none, or
    where a tag is of no known letter."""
    for m in _TAGS.finditer(line):
        tags = _TAG.findall(m.group(1))
        epoch = any(_TAG_FIELDS.get(k.lower()) == "epoch" for k, _, _ in tags)
        said = [(_of(_TAG_FIELDS.get(k.lower()), total and epoch), int(n)) for k, n, total in tags]
        fields = dict(said)
        if None not in fields and len(fields) == len(said) and ("step" in fields or "batch" in fields):
            return fields
    return {}


def _of(field: str | None, in_epoch: bool) -> str | None:
    return "batch" if field == "step" and in_epoch else field


__all__ = ["NAMED", "bar_count", "batch_beside", "counter_of", "tags_of"]
