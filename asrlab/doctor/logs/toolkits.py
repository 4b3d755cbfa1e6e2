"""The per-step lines of each toolkit, one small reader each: a line in, a step record out (or None): ``toolkit``,
``epoch``, ``batch`` (within the epoch), ``step`` (the global step where printed), ``losses`` (the total as ``loss``,
each term by its name), ``averages``, ``lr``, ``grad_norm``, ``scale`` (the loss scale), ``rate`` (steps/s), ``rank``.
Values read as the toolkit wrote them: ``nan``, ``inf`` and ``-inf`` as such."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from .counters import NAMED, batch_beside, counter_of, tags_of
from .words import OUTPUT, OWN_LOSSES

# Infinity: JSON's, as Python writes it; nan.0: Lightning's progress bar's
NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|Infinity|(?:nan|inf|NaN|Inf|INF|NAN)(?:\.0)?)"
# a key begins with a letter and follows no letter: ESPnet prints "acc=0.040loss=44.897", two fields with no comma
_PAIR = re.compile(rf"(?<![A-Za-z_])([A-Za-z_]\w*)[=:]\s?({NUM})(?=[\s,\]|)}}]|$|[A-Za-z_])")
_SPACE_PAIR = re.compile(rf"\b([a-z][a-z_]*\d*) ({NUM})(?=\s|,\s|,?$)")  # RETURNN's "step 341, ce 0.372, ctc_4 0.876"
LOSS_NAMES = re.compile(
    rf"^(?!.*scale)(?:.*(?:loss|att|transducer|pruned|simple|{OWN_LOSSES})|.*ce$|l_[a-z]\w*$|(?-i:L)$)", re.I
)
# a loss by its own name, the words a loop of its own prints: "ctc=nan", "| xent 3.2 |", "mse=1.04", BasicSR's
# "l_pix"; not a module's file that ends in one ("ctc.py:12")
_OWN_LOSS = re.compile(
    rf"^(?:.*loss.*|{OWN_LOSSES}|att|transducer|ce|\w+_(?:{OWN_LOSSES}|att|ce)|(?:ctc|ce)_\d+|l_[a-z]\w*|(?-i:L))$",
    re.I,
)
# (a loss written L, as in the papers: "L=2.31", JSON's "L": NaN; the letter alone, not LR; "| ce nan |")
_LOSSY = re.compile(
    rf"loss|{OWN_LOSSES}|transducer|\bl_[a-z]|(?-i:\bL['\"]?\s*[=:])|(?<![\w.])ce(?:['\"]?\s*[=:]|\s+[-+\d.]|\s+(?:nan|inf)\b)",
    re.I,
)


def num(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return num(text[:-2]) if isinstance(text, str) and text.endswith(".0") and text[:1].isalpha() else None


def _record(toolkit: str, epoch=None, batch=None, step=None, rank=None, **values) -> dict:
    r = dict(toolkit=toolkit, epoch=epoch, batch=batch, step=step, losses={}, averages={}, lr=None, grad_norm=None)
    return {**r, "scale": None, "rate": None, "rank": rank, **{k: v for k, v in values.items() if v is not None}}


def _grad_norm(d: dict) -> float | None:
    """A loop's gradient norm under any of its usual names."""
    return next(
        (num(d[k]) for k in ("grad_norm", "gnorm", "grad-norm", "gradnorm", "total_norm", "gn") if k in d), None
    )


def _losses(pairs) -> dict[str, float]:
    return {k: v for k, v in ((k, num(v)) for k, v in pairs) if v is not None and LOSS_NAMES.search(k)}


# WeNet: the executor's "TRAIN Batch 0/1200 loss 85.1 loss_att 80.2 loss_ctc 96.6 lr 0.00000400 rank 0" and
# train_utils' "TRAIN | steps/sec 1.7| Batch 0/100 loss 85.1 loss_att ... lr 0.001 grad_norm 12.3 rank 0"
_WENET = re.compile(
    rf"TRAIN (?:\| (?:steps/sec ({NUM})\| ?)?)?Batch (\d+)/(\d+) loss ({NUM}) (.*?)\blr ([-+\d.eE,naif ]+?)"
    rf"(?: grad_norm ({NUM}))? rank (\d+)"
)


def wenet(line: str) -> dict | None:
    if "Batch" not in line or "TRAIN" not in line or not (m := _WENET.search(line)):
        return None
    rate, epoch, batch, loss, rest, lr, gn, rank = m.groups()
    losses = {"loss": num(loss), **_losses(_SPACE_PAIR.findall(rest))}
    lr, gn, rate = num(lr.split(",")[0]), num(gn), num(rate)
    return _record("wenet", int(epoch), int(batch), rank=int(rank), losses=losses, lr=lr, grad_norm=gn, rate=rate)


# icefall: "Epoch 3, batch 1500, loss[loss=0.2, simple_loss=..., over 5000.00 frames. ], tot_loss[...],
# batch size: 56, lr: 3.00e-02, grad_scale: 16.0"
_ICEFALL = re.compile(r"Epoch (\d+), batch (\d+), loss\[(.*?)\], tot_loss\[(.*?)\](.*)")


def icefall(line: str) -> dict | None:
    if "tot_loss[" not in line or not (m := _ICEFALL.search(line)):
        return None
    epoch, batch, loss, tot, rest = m.groups()
    tail = dict(_PAIR.findall(rest.replace(": ", ":")))
    lr, scale, losses = num(tail.get("lr")), num(tail.get("grad_scale")), _losses(_PAIR.findall(loss))
    # tot_loss is the running average: a term not finite there and finite in this batch's loss[...] went
    # non-finite in an earlier batch that the log did not show
    averages = _losses(_PAIR.findall(tot))
    return _record("icefall", int(epoch), int(batch), losses=losses, lr=lr, scale=scale, averages=averages)


# ESPnet2: "[host:0/4] ... INFO: 3epoch:train:1201-1800batch: iter_time=..., loss_ctc=45.1, loss_att=30.2, acc=0.8,
# loss=34.7, grad_norm=12.3, loss_scale=1024.0, optim0_lr0=0.001, train_time=0.9"
_ESPNET = re.compile(r"(\d+)epoch:train:(\d+)-(\d+)batch:(.*)")


def espnet(line: str) -> dict | None:
    if "epoch:train:" not in line or not (m := _ESPNET.search(line)):
        return None
    epoch, start, last, rest = m.groups()
    pairs = _PAIR.findall(rest)
    d = dict(pairs)
    lr = next((num(v) for k, v in pairs if k.startswith("optim") and "lr" in k), None)
    losses = _losses((k, v) for k, v in pairs if not k.endswith("_time"))
    gn, scale = num(d.get("grad_norm")), num(d.get("loss_scale"))
    first = int(start)  # the line reports the batches since the last one: from first_batch on
    return _record("espnet", int(epoch), int(last), losses=losses, lr=lr, grad_norm=gn, scale=scale, first_batch=first)


# PyTorch Lightning's, NeMo's, any tqdm bar under any label ("steps:", "Train:", none; "Epoch 3:" names the epoch):
# "Epoch 3:  45%|████▌     | 450/1000 [01:23<01:42, 5.38it/s, v_num=1, loss=0.52, lr=0.001, global_step=3450]"
_BAR = re.compile(r"^(?:\[rank\d+\]:\s*)?([^|%\n]{0,60}?)\s*\d+%\|.*?\|\s*(\d+)/(\d+|\?)\s*\[([^\]]*)\]")
_BAR_EPOCH = re.compile(r"[Ee]poch\s*:?\s*(\d+)")
_BAR_RANK = re.compile(r"(?:[Rr]ank|[rw])\s?(\d{1,4}):?")
_RATE = re.compile(rf"({NUM})\s*(it/s|s/it)")


def lightning(line: str) -> dict | None:
    if "%|" not in line or "it" not in line or not (m := _BAR.search(line)):
        return None
    label, batch, total, inside = m.groups()
    if _NOT_TRAIN.search(label) or "cell" in inside:  # a validation bar; papermill's
        return None
    e = _BAR_EPOCH.search(label)
    pairs = _PAIR.findall(inside)
    d = dict(pairs)
    rate = _RATE.search(inside)
    steps_s = (
        (num(rate.group(1)) if rate.group(2) == "it/s" else 1 / max(num(rate.group(1)) or 1e-9, 1e-9)) if rate else None
    )
    step = d.get("global_step") or d.get("step")
    step = int(step) if step and step.isdigit() else None  # "3.2e+4": the bar rounds it; the batch is exact
    losses = _losses((k, v) for k, v in pairs if not k.startswith(("val", "v_num")))
    epoch, lr, gn = int(e.group(1)) if e else None, num(d.get("lr")), num(d.get("grad_norm"))
    bar = (label.strip(), total)  # the reader's: a bar of no name beside named ones is another loop's
    rank = int(r[1]) if (r := _BAR_RANK.fullmatch(bar[0])) else None  # a bar named by its rank: "r1: 35%|..."
    return _record("lightning", epoch, int(batch), step, losses=losses, lr=lr, grad_norm=gn, rate=steps_s, bar=bar,
                   rank=rank)  # fmt: skip


# VITS's trainer (and its forks: so-vits-svc, Bert-VITS2): "Train Epoch: 37 [22%]", then its losses, the global
# step and the learning rate as a bare list: "[2.41, 2.87, 0.53, 23.04, 1.99, 1.52, 28400, 0.000199]"
_VITS = re.compile(rf"(?:^|:)\[((?:{NUM}, ){{3,}}|)(\d+), ({NUM})\]$")
_VITS_LOSSES = ("loss_disc", "loss_gen", "loss_fm", "loss_mel", "loss_dur", "loss_kl")
_VITS_EPOCH = re.compile(r"(?:^|:|\] )Train Epoch: (\d+) \[\d+%\]$")  # "INFO:vits:Train Epoch", "[INFO] Train Epoch"


def vits(line: str) -> dict | None:
    if "Train Epoch: " in line and (e := _VITS_EPOCH.search(line.rstrip())):  # where the epoch's steps have come to
        return _record("vits", epoch=int(e[1]))
    m = _VITS.search(line.rstrip()) if line.rstrip().endswith("]") else None
    if m is None or not 0 <= (num(m[3]) or 0) < 1:  # the last is a learning rate
        return None
    values = [num(v) for v in m[1].rstrip(", ").split(", ")] if m[1] else []  # RVC's "[0, 0.0001]": its losses apart
    names = _VITS_LOSSES if len(values) == len(_VITS_LOSSES) else [f"loss_{i}" for i in range(len(values))]
    return _record("vits", step=int(m[2]), losses=dict(zip(names, values)), lr=num(m[3]))


# SpeechBrain's train_logger: "epoch: 3, lr: 1.00e+00 - train loss: 2.34 - valid loss: 1.23, valid CER: 12.3"
_SB = re.compile(rf"epoch: (\d+), lr: ({NUM}).*?- train loss: ({NUM})")


def speechbrain(line: str) -> dict | None:
    if "train loss:" not in line or not (m := _SB.search(line)):
        return None
    return _record("speechbrain", int(m.group(1)), lr=num(m.group(2)), losses={"loss": num(m.group(3))})


# Megatron(-DeepSpeed): " iteration     5426/  250000 | ... | lm loss: 2.1E+00 | loss scale: 1.0 | grad norm: nan |"
_MEGATRON = re.compile(r"^\s*iteration\s+(\d+)/\s*\d+\s*\|(.*)")
_BAR_PAIR = re.compile(rf"([a-z][a-z -]*?):\s*({NUM})\s*(?=\||$)", re.I)


def megatron(line: str) -> dict | None:
    if "iteration" not in line or "|" not in line or not (m := _MEGATRON.search(line)):
        return None
    d = {k.strip().lower(): v for k, v in _BAR_PAIR.findall(m.group(2))}
    losses = {k.replace(" ", "_"): num(v) for k, v in d.items() if "loss" in k and "scale" not in k}
    lr, gn, scale = num(d.get("learning rate")), num(d.get("grad norm")), num(d.get("loss scale"))
    return _record("megatron", step=int(m.group(1)), losses=losses, lr=lr, grad_norm=gn, scale=scale)


# an epoch and a batch counter of one's own: "Epoch 1 [TRAIN] progress 20/2754 loss nan prosody_loss ...",
# "Epoch: [7] [ 200/1251] ... loss: 4.56 (4.70)"; validation lines (CV, valid, eval) are not training steps
# (a progress line with no loss on it, "Epoch: [19][300/7922] Time: 0.630s ...", is a step too: its place is read)
_EPOCH_BATCH = re.compile(
    rf"\bEpoch\b(?:\(\w+\))?\W*(\d+)\b.*?\[?\s*(\d+)\s*/\s*\d+\s*\]?(?:.*?\bloss\b(?: is)?\s*[=:]?\s*({NUM}))?", re.I
)
# a checkpoint's place said on resuming from it; YOLO's validation bar (its HBB/OBB forks' too); papermill's, which counts a notebook's cells ("Executing:  83%|...| 5/6 [00:15<00:03, 3.20s/cell]")
_NOT_TRAIN = re.compile(
    r"\b(?:CV|cv|[Vv]alid\w*|[Ee]val\w*|[Dd]ev|[Tt]est|[Rr]esumed from)\b|(?:\b|(?<=[A-Z]))mAP(?:@|50)|"
    r"[\d.?]+(?:s/cell|cell/s)\]"
)
# terms under a label of their own: "[Losses: x 0.05, y nan, conf 0.75, cls 0.04, total 6.88]" (its total is the loss)
_LOSS_GROUP = re.compile(rf"\b[Ll]oss(?:es)?:\s*((?:[A-Za-z_]\w*\s+{NUM},?\s*)+)")
_TERM = re.compile(rf"([A-Za-z_]\w*)\s+({NUM})")


def _grouped(line: str) -> dict[str, float]:
    m = _LOSS_GROUP.search(line) if "oss" in line else None
    terms = ((("loss" if k.lower() == "total" else k), num(v)) for k, v in _TERM.findall(m.group(1))) if m else ()
    return {k: v for k, v in terms if v is not None}


_FASTPROGRESS = re.compile(rf"\[\d+/\d+ [\d:]+<[\d:?]*\.\.\. ({NUM})\]")
_TOTAL = re.compile(r"\s*/\s*(\d+)")


def epoch_batch(line: str) -> dict | None:
    if "poch" not in line or "/" not in line or line.lstrip().startswith("{"):  # a dict line: the kv reader's
        return None
    m = _EPOCH_BATCH.search(line)
    if not m or _NOT_TRAIN.search(line) or (m.group(3) is None and "%|" in line):  # a bar: lightning's reader
        return None
    pairs = _SPACE_PAIR.findall(line) + _PAIR.findall(line.replace(": ", ":"))
    step = counter_of(line, named=True)  # a global step printed beside the epoch's own counter
    losses = {**({"loss": num(m.group(3))} if m.group(3) else {}), **_losses(pairs), **_grouped(line)}
    lr, gn = num(dict(pairs).get("lr")), _grad_norm(dict(pairs))
    if not losses and (fp := _FASTPROGRESS.search(line)):  # fastprogress's bar: its loss after the times, unnamed
        losses = {"loss": num(fp.group(1))}
    # a bar (Ignite's "Epoch [2/3]: [5/12]  42%|..., loss=3.67", fastprogress's "50.00% [6/12 00:00<00:00... 9.12]"),
    # known by its total: its redraws go back only against its own (a validation bar's [0/2] after [12/12])
    drawn = (t.group(1) if (t := _TOTAL.match(line, m.end(2))) else "") if "%|" in line or "% [" in line else None
    return _record(
        "epoch_batch", int(m.group(1)), int(m.group(2)), step, losses=losses, lr=lr, grad_norm=gn, drawn=drawn
    )


# a loop of one's own: "step 120 loss 3.21", "step=120, loss=nan, lr=1e-3", "[step 120] loss: 3.2 grad_norm: 8",
# "step 249 \t total loss = 0.775"
_PLAIN = re.compile(rf"\b(?:global_)?step[\s=:]\s*(\d+)\b[^\n]*?\bloss\b\s*[=:]?\s*({NUM})", re.I)


_PADDED = re.compile(r":\s+")  # "grad_norm:     inf": a value padded to its column


def plain(line: str) -> dict | None:
    # "epoch 3 step 40: cv loss 3.2" is not a training step
    if "loss" not in line.lower() or not (m := _PLAIN.search(line)) or _NOT_TRAIN.search(line):
        return None
    pairs = _PAIR.findall(_PADDED.sub(":", line)) + _SPACE_PAIR.findall(line)
    d = dict(pairs)
    epoch = d.get("epoch")
    epoch = int(float(epoch)) if epoch and num(epoch) is not None and num(epoch) == num(epoch) else None
    losses, scale = {"loss": num(m.group(2)), **_losses(pairs)}, num(d.get("scale") or d.get("loss_scale"))
    lr, gn = num(d.get("lr")), _grad_norm(d)
    return _record("plain", epoch, step=int(m.group(1)), losses=losses, lr=lr, grad_norm=gn, scale=scale)


# any trainer's key-value line: Hugging Face Trainer's "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05,
# 'epoch': 1.2}", JSON lines, "loss=nan lr=..."; read last, where no toolkit's own reader fits
_KV = re.compile(
    rf"""['"]?\b([A-Za-z_][\w/.-]*)(?:['"]\s*:\s*|\s*[=≈]\s*|\s*:\s+)['"]?({NUM})(?:(?<=nan)x+|(?<=inf)x+)?['"]?(?=[\s,;}}\]|)]|$|[A-Z][a-z])"""
)  # a value may have the next output glued on ("loss: nanEpoch 1/1000": Keras's bar, then a print); PaddleOCR pads
# its values to 6 with x ("loss: nanxxx")
_BRACKET = re.compile(rf"\[([A-Za-z_]\w*)\]\s+({NUM})(?=[\s|,]|$)")  # "[Loss] nan | [step]  1574"
_PIPE = re.compile(rf"(?:^|\|)\s*([A-Za-z_]\w*)\s+({NUM})\s*(?=\||$)")  # fairseq's "| loss nan | num_updates 9 |"
_COUNTER = re.compile(
    r"""['"]?\b(global_step|step|steps|iter|iteration|itr|it|num_updates|n_?upd(?:ates)?|updates|update|upd|batch_idx|batch|tick)['"]?"""
    r"""\s*(?:[=:#]\s*|\s+|\[)['"]?(\d{1,3}(?:,\d{3})+|\d+)\b(?!\.\d)(?!\s*/\s*\d)(?!\s*->)""",  # "iter:   3,200", "upd#0025"
    re.I,
)
# of several counters on one line ("it": 40, "upd": 20: micro-batches and the updates they made), the step is the
# optimizer's: updates before iterations, iterations before a batch's place
_RANKED = ("global_step", "num_updates", "nupd", "n_upd", "n_updates", "updates", "update", "upd", "step", "steps")


def _counter(line: str):
    found = list(_COUNTER.finditer(line))
    order = lambda m: (m[1].lower() not in _RANKED, m[1].lower().startswith("batch"))  # noqa: E731
    return min(found, key=order) if found else None


# "[ep 1 | it 00007/00030] ctc=...", "ep 0 it 18 loss 1.0", "ep=2 mb=4/5 loss=..." (another key=value after it)
_EPOCH_WORD = re.compile(
    r"\b(?:ep|epoch)\s*[=:]?\s*\[?(\d+)(?:\s*(?:\||,|/|$)|\s+(?=(?:it|iter|step|batch)\b|[A-Za-z_]\w*=))", re.I
)
# a loss said in words: "Loss nan (nan)", "Loss is NaN", "loss: inf", HiFi-GAN's "Gen Loss Total :  nan"
_LOSS_WORD = re.compile(rf"\b((?:[A-Za-z]\w*[_ ])?[Ll]oss(?: Total)?)(?: \(\w+\))?(?: is| ?:)?\s+\[?({NUM})\b")
# I-JEPA's and its descendants' "[1,   100] loss: 0.123 ...", "[36,   400/ 2562] - train_losses - ...": epoch, iteration
_EPOCH_ITR = re.compile(r"^\[(\d+),\s*(\d+)(?:\s*/\s*\d+)?\] ")
_RANK_VALUE = re.compile(r""":\s*['"](?:r|rk|rank[ _-]?)(\d+)['"]""")
_BAR_COUNT = re.compile(r"(?<![\w.])(\d+)\s*/\s*(\d+)(?![\d.])")
# a value and its running average, as metric loggers print them ("loss: 5.6569 (nan)", "Loss 2.31 (2.40)")
_AVERAGED = re.compile(rf"\b([A-Za-z_][\w/.-]*)(?:\s*[:=]\s*|\s+){NUM}\s+\(({NUM})\)")


def _key(k: str) -> str:
    """A logger's name for a value: its last part ("train/loss"), a loss's terms by their whole name ("Loss/giou")."""
    head, _, last = k.rpartition("/")
    return k.replace("/", "_") if head and not _OWN_LOSS.match(last) and _OWN_LOSS.match(head) else last


def kv(line: str) -> dict | None:
    if not _LOSSY.search(line) or _NOT_TRAIN.search(line):  # a validation line (or one with an eval_ key)
        return None
    raw = _KV.findall(line)
    pairs = [(_key(k), v) for k, v in raw + _PIPE.findall(line) + _BRACKET.findall(line)]
    pairs += [(k.strip().replace(" ", "_").lower(), v) for k, v in _LOSS_WORD.findall(line)]
    pairs += [(k, v) for k, v in _SPACE_PAIR.findall(line) if _OWN_LOSS.match(k) or k == "lr"]  # "it 4 ctc nan lr 1e-3"
    # "ctc:4.38" glued, not a logger's "(ctc:74)", a module's line
    pairs = pairs or [(k, v) for k, v in _PAIR.findall(line) if _OWN_LOSS.match(k) and not v.isdigit()]
    # a loss's average gone non-finite took a non-finite loss in since the last line, though this one is finite
    # (not a gradient norm's: fp16's overflowing steps, skipped by the scaler, leave its average inf for good)
    averaged = [(k.split("/")[-1], a) for k, a in _AVERAGED.findall(line) if "loss" in k.lower()]
    gone = {k: a for k, a in averaged if a.lower().lstrip("+-") in ("nan", "inf")}
    pairs = [(k, gone.get(k, v)) for k, v in pairs]
    losses = _losses(pairs)
    if not any(_OWN_LOSS.match(k) for k in losses):  # a loss by its name, not a module:line that ends in "ctc"
        return None
    # a model's outputs printed not finite (a preference trainer's 'logps/chosen': nan): the model is, whatever its loss
    outputs = ((k, num(v)) for k, v in raw if OUTPUT.match(k))
    losses.update((k, v) for k, v in outputs if v is not None and not math.isfinite(v))
    d = {k.lower(): v for k, v in pairs}
    counter = NAMED.search(line) or _counter(line)
    # a count of the epochs ("Epoch: 13/1250 (3/8)") is no bar: the next is
    bars = (b for b in _BAR_COUNT.finditer(line) if "poch" not in line[max(b.start() - 8, 0) : b.start()])
    bar = next(bars, None) if counter is None else None
    epoch = num(d.get("epoch") or ((m := _EPOCH_WORD.search(line)) and m.group(1)))
    if jepa := _EPOCH_ITR.match(line) if counter is None else None:
        bar, epoch = None, float(jepa[1])
    tags = tags_of(line) if counter is None and bar is None else {}  # "[E00|S0015|b015|r1] ctc:4.38"
    if counter is None and bar is None and epoch is None and not tags:
        return None  # a loss with no place in training: a summary or a sentence, not a step line
    epoch = tags.get("epoch", epoch)
    epoch = int(epoch) if epoch is not None and epoch == int(epoch) else epoch
    batch = int(bar.group(1)) if bar else int(jepa[2]) if jepa else tags.get("batch", batch_beside(d, counter))
    step = int(counter.group(counter.lastindex).replace(",", "")) if counter else tags.get("step")
    lr, scale = (
        num(d.get("lr") or d.get("learning_rate")),
        num(d.get("loss_scale") or d.get("grad_scale") or d.get("scale")),
    )
    said = d.get("rank") or d.get("rk") or ""  # a JSON line's "rank": 1 (or "rk", as the compact tags say it)
    tag = _RANK_VALUE.search(line)  # or a value that is a rank's tag: "@": "r1", "who": "rank1"
    rank = int(said) if said.isdigit() else tags.get("rank", int(tag[1]) if tag else None)
    return _record("kv", epoch, batch, step, losses=losses, lr=lr, grad_norm=_grad_norm(d), scale=scale, rank=rank)


# darknet's "1013: 6.6e21, 6.6e20 avg, 0.001000 rate, 1.95 seconds, 6078 images" (later: "avg loss")
_DARKNET = re.compile(rf"^\s*(\d+): ({NUM}), ({NUM}) avg(?: loss)?, ({NUM}) rate\b")


def darknet(line: str) -> dict | None:
    if " avg" not in line or not (m := _DARKNET.match(line)):
        return None
    return _record("darknet", step=int(m[1]), losses={"loss": num(m[2])}, averages={"loss": num(m[3])}, lr=num(m[4]))


# Marian's "Ep. 1 : Up. 51000 : Sen. 77,303,338 : Cost 1.41794586 : Time 370.55s : 97447.45 words/s : gNorm 0.5275"
_MARIAN = re.compile(rf"\bEp\. (\d+) : Up\. (\d+) : Sen\. [\d,]+ : Cost ({NUM})")
_MARIAN_GNORM = re.compile(rf"gNorm ({NUM})")
_MARIAN_VALID = re.compile(r"\[valid\] Ep\. (\d+) : Up\. (\d+) : ")  # its validation, at that many updates


def marian(line: str) -> dict | None:
    m = _MARIAN.search(line) if "Up. " in line else None
    if m is None and "[valid]" in line and (v := _MARIAN_VALID.search(line)):
        return _record("marian", int(v[1]), step=int(v[2]))  # where training is: no loss of its own
    if m is None:
        return None
    g = _MARIAN_GNORM.search(line)
    return _record("marian", int(m[1]), step=int(m[2]), losses={"cost": num(m[3])}, grad_norm=num(g[1]) if g else None)


# XLM's and UnsupervisedMT's trainer, under their logger's "INFO - 09/08/18 11:28:33 - 0:29:30 - ": "   1000 -
# 72.85 sent/s -  2105.00 words/s - XE-en-en:  3.7582 || XE-fr-fr:  3.5753 || ... - LR: 1.0000e-04"
_XLM = re.compile(r" - \d+:\d\d:\d\d - +(\d+) - +[\d.]+ sent/s - (.*)")
_XLM_PAIR = re.compile(rf"([A-Za-z][\w-]*): +({NUM})")


def xlm(line: str) -> dict | None:
    if "sent/s" not in line or not (m := _XLM.search(line)):
        return None
    pairs = _XLM_PAIR.findall(m[2])
    lr = next((num(v) for k, v in pairs if k == "LR"), None)
    return _record("xlm", step=int(m[1]), losses={k: num(v) for k, v in pairs if k != "LR"}, lr=lr)


# NVIDIA's Tacotron 2: "Train loss 175 0.189592 Grad Norm 0.491446 4.42s/it" (its iteration, then the loss)
_TACOTRON = re.compile(rf"^Train loss (\d+) ({NUM}) Grad Norm ({NUM})")


def tacotron(line: str) -> dict | None:
    m = _TACOTRON.match(line) if line.startswith("Train loss ") else None
    return None if m is None else _record("tacotron", step=int(m[1]), losses={"loss": num(m[2])}, grad_norm=num(m[3]))


# TD-MPC2's logger: " train            E: 998                   I: 499,500               R: 937.0   ..." (its
# episode and its step, then the episode's reward, no loss)
_TDMPC = re.compile(r"^\s*train\s+E: (\d+)\s+I: (\d{1,3}(?:,\d{3})*)\s")


def tdmpc(line: str) -> dict | None:
    m = _TDMPC.match(line) if "I: " in line else None
    return None if m is None else _record("tdmpc", int(m[1]), step=int(m[2].replace(",", "")))


# a line that only says where training is: Piper's "Epoch: 2632. Steps: 1363964", "epoch 3, global step 1200"
_PLACE = re.compile(r"^\s*Epoch:? (\d+)[.,]? (?:global )?steps?:? (\d+)\.?\s*$", re.I)


def place(line: str) -> dict | None:
    m = _PLACE.match(line) if "poch" in line else None
    return None if m is None else _record("place", int(m[1]), step=int(m[2]))


# NVIDIA's DLLogger: "DLL 2020-10-30 14:53:19.377231 - (67, 9) glob_iter/iters_per_epoch : 2985/186", then
# "DLL ... - (67, 9) train_loss : -4.36": a step's values a line each under its (epoch, iteration) tuple
_DLL = re.compile(r"^DLL (?:\S+ \S+ )?- \((\d+), (\d+)\) (.*)")
_DLL_PAIR = re.compile(rf"([A-Za-z_][\w/]*) : ({NUM})(?:/\d+)?(?=\s|$)")


def dllogger(line: str) -> dict | None:
    if not line.startswith("DLL ") or not (m := _DLL.match(line)):
        return None
    pairs = [(k.split("/")[0], v) for k, v in _DLL_PAIR.findall(m[3])]
    step = next((int(v) for k, v in pairs if k in ("glob_iter", "global_step", "step", "iteration")), None)
    losses = _losses((k, v) for k, v in pairs if not k.startswith(("val", "eval")))
    if step is None and not losses:  # a throughput's, a time's line: not a step's
        return None
    return _record("dllogger", int(m[1]), int(m[2]), step, losses=losses)


# each toolkit's reader, named as its function, in the order they are tried
READERS: tuple[tuple[str, Callable[[str], dict | None]], ...] = tuple(
    (f.__name__, f)
    for f in (wenet, icefall, espnet, lightning, speechbrain, vits, megatron, darknet, marian, dllogger, xlm, tdmpc)
    + (tacotron, place, epoch_batch, plain, kv)
)


def validation(line: str) -> bool:
    """Whether a line is of a validation or test pass ("[CV]", "valid", "eval", "dev"), not a training step."""
    return bool(_NOT_TRAIN.search(line))


def step_of(line: str, first: Callable[[str], dict | None] | None = None) -> dict | None:
    """The step record of a line, trying the reader that fitted last first (a log keeps its format)."""
    # asrlab's numerics guard on a step it skipped, the watch's verdict quoting a line: reports, not step lines
    if "skipped so far)" in line or line.startswith("asrlab watch: "):
        return None
    first = None if first is kv else first  # kv fits many lines: every toolkit's own reader is tried before it
    if first is not None and (r := first(line)) is not None:
        return r
    for _, reader in READERS:
        if reader is not first and (r := reader(line)) is not None:
            return r
    return None


__all__ = ["READERS", "num", "step_of", "validation"]
