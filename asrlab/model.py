"""A small Conformer-CTC acoustic model (WeNet family), in one readable file.

Data flow, with shapes (B = batch, T = input frames, F = fbank bins, D = d_model,
V = vocab size, T' = frames after subsampling):

    feats (B, T, F) --per-utterance CMVN--> ConvSubsampling (x2 or x4 in time)
        --> (B, T', D) --positional encoding--> N x ConformerBlock
        --> Linear(D, V) --> log_softmax (float32) --> (B, T', V)

Design choices (all deliberate, see the classes for details):

* Input normalisation is per-utterance CMVN (``UtteranceCMVN``): each mel bin
  minus its mean over the utterance's real frames, over their standard
  deviation. The data side hands us raw log-mel fbank whose level and spectral
  tilt depend on the voice; this removes both, keeps each frame's energy (the
  speech/silence cue), is stateless, needs no statistics pass over the corpus
  and ignores padding. A per-frame LayerNorm would throw the energy away,
  and trains to a worse CER (docs/recognition.md, "Input normalisation").
* No normalisation layer lets padding or other utterances in: the input CMVN
  counts only the utterance's real frames, and the conv module uses LayerNorm
  instead of WeNet's default BatchNorm, so padded frames never leak into real
  ones, in training or in eval. Together with the attention key mask
  and zeroing padded frames right before the depthwise conv, an utterance's
  output does not depend on how much padding sits after it (tested).
* The subsampling convs use no padding, so a real output frame only ever sees
  real input frames; ``output_lengths`` is the exact conv length formula.
* CTC blank is index 0. ``forward`` returns log-probs in float32 even under
  autocast. ``ctc_loss`` drops (and counts) utterances CTC cannot align instead
  of hiding them behind ``zero_infinity``.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig  # the model's section of a config (torch-free, for the launcher)
from .errors import UsageError

log = logging.getLogger(__name__)

BLANK = 0


# ----------------------------------------------------------------------------- lengths


def output_lengths(feat_lens, subsampling: int):
    """Frames after ``ConvSubsampling`` for input lengths ``feat_lens`` (int or long tensor).

    x4: two 3x3 stride-2 convs without padding -> ((T - 1) // 2 - 1) // 2.
    x2: a 3x3 stride-2 conv, then a 3x3 conv with time stride 1 -> (T - 1) // 2 - 2.
    Lengths too short to produce a frame give 0 (never negative).
    """
    if subsampling == 4:
        out = ((feat_lens - 1) // 2 - 1) // 2
    elif subsampling == 2:
        out = (feat_lens - 1) // 2 - 2
    else:
        raise UsageError(f"subsampling must be 2 or 4, got {subsampling!r}")
    if isinstance(out, torch.Tensor):
        return out.clamp(min=0).long()
    return max(int(out), 0)


def min_input_frames(subsampling: int) -> int:
    """Smallest number of input frames giving one output frame (7 for both x2 and x4)."""
    t = 1
    while output_lengths(t, subsampling) < 1:
        t += 1
    return t


def lengths_to_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B,) lengths -> (B, max_len) bool mask, True on real frames."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


# ----------------------------------------------------------------------------- modules


DIGITAL_SILENCE = math.log(torch.finfo(torch.float32).eps) + 0.01  # Kaldi fbank of exact zeros: log(FLT_EPSILON)


class UtteranceCMVN(nn.Module):
    """(B, T, F) fbank, (B,) lengths -> each bin standardised over the utterance's real
    frames (mean 0, variance 1, in float32); padded frames come out 0. No parameters.

    Digital silence (exact zero samples: padded, edited or gated recordings) comes out of Kaldi
    fbank at log(FLT_EPSILON) = -15.9 in every bin, some 10 nats below the quantisation noise of any
    recorded sound; left as it is, it dominates each bin's variance and squeezes the speech into a
    narrow band. Such values become the bin's quiet end: the mean minus 1.28 standard deviations of
    the bin's other values in the utterance (the 10th percentile, were they Gaussian), where
    training's silences, always noisy, sit, so exact zeros decode as well as faint noise does
    (benchmarks/error_factors.txt). Audio without digital silence is untouched by this.
    """

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> torch.Tensor:
        x = feats.float()
        m = lengths_to_mask(feat_lens.to(x.device), x.size(1))[..., None].to(x.dtype)  # (B, T, 1)
        silent = x <= DIGITAL_SILENCE  # no host sync: a no-op where nothing is silent
        sound = (silent.logical_not() & m.bool()).to(x.dtype)
        mean, var = _bin_stats(x, sound)
        x = torch.where(silent & (sound.sum(dim=1, keepdim=True) > 0), mean - 1.28 * var.sqrt(), x)
        mean, var = _bin_stats(x, m)
        return (x - mean) * m * torch.rsqrt(var + self.eps)


def _bin_stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each bin's mean and variance over the frames where ``w`` (B, T, 1 or F) is 1: (B, 1, F) each."""
    n = w.sum(dim=1, keepdim=True).clamp(min=1.0)
    mean = (x * w).sum(dim=1, keepdim=True) / n
    return mean, ((x - mean) * w).pow(2).sum(dim=1, keepdim=True) / n


class ConvSubsampling(nn.Module):
    """Conv2d front end: (B, T, F) -> (B, T', D), like WeNet's Conv2dSubsampling4.

    Both variants subsample frequency x4 (F -> F'' = ((F - 1) // 2 - 1) // 2) so the
    projection Linear(D * F'', D) has the same size; only the time stride of the
    second conv differs (2 for x4, 1 for x2). No padding: real outputs see only
    real inputs.
    """

    def __init__(self, input_dim: int, d_model: int, subsampling: int, channels: int = 0):
        super().__init__()
        self.subsampling = subsampling
        t_stride = 2 if subsampling == 4 else 1
        c = channels or d_model
        self.conv = nn.Sequential(
            nn.Conv2d(1, c, kernel_size=3, stride=2),
            nn.ReLU(),
            nn.Conv2d(c, c, kernel_size=3, stride=(t_stride, 2)),
            nn.ReLU(),
        )
        freq_out = ((input_dim - 1) // 2 - 1) // 2
        self.proj = nn.Linear(c * freq_out, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x.unsqueeze(1))  # (B, D, T', F'')
        b, c, t, f = x.shape
        return self.proj(x.transpose(1, 2).reshape(b, t, c * f))


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embeddings (len(positions), dim): [sin(p * w_i) | cos(p * w_i)],
    w_i = 10000 ** (-2i / dim). Positions may be negative (relative distances)."""
    freqs = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) * (-math.log(10000.0) / dim)
    )
    angles = positions.float()[:, None] * freqs[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class AbsPositionalEncoding(nn.Module):
    """x * sqrt(D) + sinusoid(t). Returns (x, None): no separate position input."""

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        pe = sinusoids(torch.arange(x.size(1), device=x.device), self.d_model)
        return self.dropout(x * self.xscale + pe.to(x.dtype)), None


class RelPositionalEncoding(nn.Module):
    """Transformer-XL style: scales x by sqrt(D) and returns the embeddings of all
    relative distances T'-1, T'-2, ..., -(T'-1) as pos_emb (1, 2T'-1, D), consumed
    by ``MultiHeadSelfAttention`` (ESPnet/WeNet "latest" rel_pos)."""

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.size(1)
        pe = sinusoids(torch.arange(t - 1, -t, -1, device=x.device), self.d_model)
        return self.dropout(x * self.xscale), self.dropout(pe.to(x.dtype)[None])


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, 2T-1) scores against distances T-1 .. -(T-1) -> (B, H, T, T) with
    out[..., i, j] = x[..., i, T-1-i+j], i.e. the score for distance i - j.
    The pad-and-reshape trick from Transformer-XL (no gather)."""
    b, h, t, p = x.shape
    x = F.pad(x, (1, 0))  # (B, H, T, P+1)
    x = x.view(b, h, p + 1, t)[:, :, 1:].reshape(b, h, t, p)
    return x[..., :t]


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention with a key padding mask; relative-position variant
    (``relative=True``) adds learnt biases u, v and a position projection as in
    Transformer-XL: score(i, j) = (q_i + u) k_j + (q_i + v) W_pos r_{i-j}."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, relative: bool):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.logits = nn.Identity()  # a probe: diagnostics hooks see the raw q.k products (fp16 overflows here first)
        self.relative = relative
        if relative:
            self.linear_pos = nn.Linear(d_model, d_model, bias=False)
            self.pos_bias_u = nn.Parameter(torch.empty(n_heads, self.d_head))
            self.pos_bias_v = nn.Parameter(torch.empty(n_heads, self.d_head))
            nn.init.xavier_uniform_(self.pos_bias_u)
            nn.init.xavier_uniform_(self.pos_bias_v)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D), mask (B, T) bool True on real frames, pos_emb (1, 2T-1, D)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.d_head).unbind(2)  # (B,T,H,dh)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, dh)
        if self.relative:
            p = self.linear_pos(pos_emb).view(1, -1, self.n_heads, self.d_head).transpose(1, 2)
            content = (q + self.pos_bias_u).transpose(1, 2) @ k.transpose(-2, -1)  # (B,H,T,T)
            position = (q + self.pos_bias_v).transpose(1, 2) @ p.transpose(-2, -1)  # (B,H,T,2T-1)
            scores = content + rel_shift(position)
        else:
            scores = q.transpose(1, 2) @ k.transpose(-2, -1)
        scores = self.logits(scores) / math.sqrt(self.d_head)
        key_pad = ~mask[:, None, None, :]  # (B, 1, 1, T)
        scores = scores.masked_fill(key_pad, torch.finfo(scores.dtype).min)
        # Zero again after softmax: rows of a zero-length utterance would be uniform.
        attn = scores.softmax(dim=-1).masked_fill(key_pad, 0.0)
        y = self.dropout(attn).to(v.dtype) @ v  # (B, H, T, dh)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    """Linear(D, ff) -> Swish -> Dropout -> Linear(ff, D)."""

    def __init__(self, d_model: int, ff_dim: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, ff_dim), nn.SiLU(), nn.Dropout(dropout), nn.Linear(ff_dim, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvModule(nn.Module):
    """Conformer conv module: pointwise (D -> 2D) -> GLU -> depthwise conv over time
    -> LayerNorm -> Swish -> pointwise (D -> D). Padded frames are zeroed right
    before the depthwise conv, so it sees exactly the zero padding it would see on
    an unpadded utterance. LayerNorm (not BatchNorm) keeps frames independent."""

    def __init__(self, d_model: int, kernel: int):
        super().__init__()
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, padding=kernel // 2, groups=d_model)
        self.norm = nn.LayerNorm(d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), mask (B, T) bool True on real frames."""
        x = F.glu(self.pointwise_in(x), dim=-1)
        x = x.masked_fill(~mask[..., None], 0.0)
        x = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        return self.pointwise_out(F.silu(self.norm(x)))


class ConformerBlock(nn.Module):
    """Pre-norm macaron block: x + FF/2, + MHSA, + Conv, + FF/2, then LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.ff1_norm, self.ff1 = nn.LayerNorm(d), FeedForward(d, cfg.ff_dim, cfg.dropout)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = MultiHeadSelfAttention(d, cfg.n_heads, cfg.dropout, cfg.pos_enc == "rel")
        self.conv_norm, self.conv = nn.LayerNorm(d), ConvModule(d, cfg.conv_kernel)
        self.ff2_norm, self.ff2 = nn.LayerNorm(d), FeedForward(d, cfg.ff_dim, cfg.dropout)
        self.final_norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor | None) -> torch.Tensor:
        x = x + 0.5 * self.dropout(self.ff1(self.ff1_norm(x)))
        x = x + self.dropout(self.attn(self.attn_norm(x), mask, pos_emb))
        x = x + self.dropout(self.conv(self.conv_norm(x), mask))
        x = x + 0.5 * self.dropout(self.ff2(self.ff2_norm(x)))
        return self.final_norm(x)


class ConformerCTC(nn.Module):
    """Conformer encoder + linear CTC head (blank = 0).

    forward(feats (B, T, F) float, feat_lens (B,) long)
        -> log_probs (B, T', V) float32 log_softmax, out_lens (B,) long.
    Frames of log_probs at t >= out_lens[b] are padding (finite, meaningless).
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2 (blank + 1 label), got {vocab_size!r}")
        self.cfg, self.vocab_size = cfg, vocab_size
        self.input_norm = UtteranceCMVN()
        self.subsample = ConvSubsampling(cfg.input_dim, cfg.d_model, cfg.subsampling, cfg.conv_channels)
        pos_cls = RelPositionalEncoding if cfg.pos_enc == "rel" else AbsPositionalEncoding
        self.pos_enc = pos_cls(cfg.d_model, cfg.dropout)
        self.blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.n_layers))
        self.ctc_head = nn.Linear(cfg.d_model, vocab_size)
        log.debug("ConformerCTC %s vocab=%d: %d parameters", cfg, vocab_size, count_parameters(self))

    def output_lengths(self, feat_lens):
        """T' for input lengths (int or long tensor); see module-level ``output_lengths``."""
        return output_lengths(feat_lens, self.cfg.subsampling)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if feats.dim() != 3 or feats.size(-1) != self.cfg.input_dim:
            raise ValueError(f"feats must be (B, T, {self.cfg.input_dim}), got {tuple(feats.shape)}")
        need = min_input_frames(self.cfg.subsampling)
        if feats.size(1) < need:
            raise ValueError(f"feats has {feats.size(1)} frames; need >= {need} for one output frame")
        x = self.subsample(self.input_norm(feats, feat_lens))  # (B, T', D)
        out_lens = self.output_lengths(feat_lens.to(x.device))
        mask = lengths_to_mask(out_lens, x.size(1))
        x, pos_emb = self.pos_enc(x)
        for block in self.blocks:
            x = block(x, mask, pos_emb)
        logits = self.ctc_head(x)
        with torch.autocast(device_type=logits.device.type, enabled=False):
            log_probs = logits.float().log_softmax(dim=-1)
        return log_probs, out_lens


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (all, or only those with requires_grad)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ----------------------------------------------------------------------------- CTC


def min_ctc_frames(labels: Sequence[int]) -> int:
    """Fewest frames CTC needs for ``labels``: one per label plus one blank between
    each pair of equal adjacent labels ("aa" needs 3, "ab" needs 2)."""
    labels = list(labels)
    return len(labels) + sum(a == b for a, b in zip(labels, labels[1:]))


def alignable(out_lens: torch.Tensor, targets: torch.Tensor, target_lens: torch.Tensor) -> torch.Tensor:
    """(B,) bool: which utterances CTC can align (see ``min_ctc_frames``), computed where the inputs lie."""
    targets = targets.clamp(min=0)  # padding value (-1 or 0) is never read past target_lens
    out_lens, target_lens = out_lens.to(targets.device), target_lens.to(targets.device)
    max_len = targets.size(1)
    same = targets[:, 1:] == targets[:, :-1]  # (B, L-1)
    inside = torch.arange(max(max_len - 1, 0), device=targets.device)[None] < (target_lens[:, None] - 1)
    return out_lens >= target_lens + (same & inside).sum(dim=1)


def ctc_loss(
    log_probs: torch.Tensor,
    out_lens: torch.Tensor,
    targets: torch.Tensor,
    target_lens: torch.Tensor,
    host_targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Summed CTC loss (nats) over the utterances CTC can align.

    log_probs (B, T', V) float log_softmax, out_lens (B,), targets (B, L) long padded
    with -1 or 0 past target_lens, target_lens (B,).

    An utterance is alignable iff out_len >= target_len + (number of equal adjacent
    labels), see ``min_ctc_frames``. Unalignable ones would give an infinite loss;
    they are excluded and counted rather than zeroed by ``zero_infinity``.

    ``host_targets``: the targets on the host, with ``out_lens`` and ``target_lens`` there too. The
    mask, its count and the lengths CTC needs on the host are then found there, and nothing is read
    back from the device (without them, counting the mask waits for the device).

    Returns (loss_sum, n_unalignable, mask): loss_sum is a 0-dim tensor, the *sum*
    over alignable utterances (divide by ``mask.sum()`` for a per-utterance mean,
    or by ``target_lens[mask].sum()`` for a per-token mean: the caller decides);
    mask (B,) bool is True for the utterances included. If none is alignable,
    loss_sum is an exact zero that still has a grad_fn (backward is a no-op).
    """
    if host_targets is None:
        out_lens, target_lens = out_lens.to(targets.device), target_lens.to(targets.device)
    mask = alignable(out_lens, targets if host_targets is None else host_targets, target_lens)
    b = mask.numel()
    n_unalignable = int(b - mask.sum())
    if n_unalignable == b:
        return log_probs[:0].sum(), n_unalignable, mask
    lp, tg = log_probs, targets.clamp(min=0)
    if n_unalignable:
        keep = mask.nonzero().squeeze(1)
        lp = log_probs.index_select(0, keep.to(log_probs.device))
        tg = tg.index_select(0, keep.to(tg.device))
        out_lens, target_lens = out_lens[keep.to(out_lens.device)], target_lens[keep.to(target_lens.device)]
    losses = F.ctc_loss(
        lp.transpose(0, 1),  # (T', B', V)
        tg,
        out_lens,
        target_lens,
        blank=BLANK,
        reduction="none",
        zero_infinity=False,
    )
    return losses.sum(), n_unalignable, mask


def mean_ctc_loss(log_probs, out_lens, targets, target_lens, host_targets=None) -> tuple[torch.Tensor, int]:
    """The training objective: CTC loss per alignable utterance (nats), and how many were left out."""
    loss_sum, n_unalignable, mask = ctc_loss(log_probs, out_lens, targets, target_lens, host_targets)
    return loss_sum / max(1, mask.numel() - n_unalignable), n_unalignable
