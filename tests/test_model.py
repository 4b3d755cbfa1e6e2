"""Tests for asrlab.model: shapes, masks, CTC bookkeeping, decoding, metrics, learning."""

import math

import pytest
import torch
import torch.nn.functional as F

from asrlab.model import (
    ConformerCTC,
    ModelConfig,
    count_parameters,
    ctc_loss,
    min_ctc_frames,
    output_lengths,
    rel_shift,
    UtteranceCMVN,
)
from asrlab.scoring import cer, greedy_decode, wer

V = 12


def small_cfg(**kw) -> ModelConfig:
    base = dict(input_dim=20, d_model=32, n_heads=4, n_layers=2, ff_dim=64, conv_kernel=5, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- config


def test_default_config_is_tiny():
    n = count_parameters(ConformerCTC(ModelConfig(), vocab_size=32))
    assert 1_500_000 <= n <= 3_000_000, n


@pytest.mark.parametrize(
    "kw",
    [
        dict(subsampling=3),
        dict(pos_enc="rope"),
        dict(d_model=30, n_heads=4),
        dict(conv_kernel=4),
        dict(dropout=1.0),
        dict(n_layers=0),
        dict(input_dim=5),
    ],
)
def test_config_validation(kw):
    with pytest.raises(ValueError):
        ModelConfig(**kw)


# ----------------------------------------------------------------------------- shapes, lengths, masks


@pytest.mark.parametrize("subsampling", [2, 4])
@pytest.mark.parametrize("pos_enc", ["rel", "abs"])
def test_shapes_and_lengths(subsampling, pos_enc):
    model = ConformerCTC(small_cfg(subsampling=subsampling, pos_enc=pos_enc), V).eval()
    lens = torch.tensor([61, 40, 7])
    log_probs, out_lens = model(torch.randn(3, 61, 20), lens)
    t_out = output_lengths(61, subsampling)
    assert log_probs.shape == (3, t_out, V)
    assert log_probs.dtype == torch.float32
    assert out_lens.dtype == torch.long
    assert out_lens.tolist() == model.output_lengths(lens).tolist()
    assert out_lens.tolist() == [output_lengths(int(n), subsampling) for n in lens]
    assert out_lens[2] == 1  # 7 frames is the minimum that yields one output frame
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(3, t_out), atol=1e-5)


def test_output_lengths_formula():
    assert output_lengths(200, 4) == 49 and output_lengths(200, 2) == 97
    assert output_lengths(torch.tensor([0, 3, 6, 7]), 4).tolist() == [0, 0, 0, 1]
    assert output_lengths(torch.tensor([0, 3, 6, 7]), 2).tolist() == [0, 0, 0, 1]


def test_rel_shift_matches_direct_indexing():
    t = 5
    x = torch.randn(2, 3, t, 2 * t - 1)
    i, j = torch.meshgrid(torch.arange(t), torch.arange(t), indexing="ij")
    assert torch.equal(rel_shift(x), x[:, :, i, t - 1 - i + j])


@pytest.mark.parametrize("subsampling", [2, 4])
@pytest.mark.parametrize("pos_enc", ["rel", "abs"])
def test_padding_invariance(subsampling, pos_enc):
    model = ConformerCTC(small_cfg(subsampling=subsampling, pos_enc=pos_enc), V).eval()
    short = torch.randn(1, 37, 20)
    batch = torch.randn(2, 80, 20) * 3.0  # padding region holds garbage, not zeros
    batch[1, :37] = short[0]
    with torch.no_grad():
        alone, alone_len = model(short, torch.tensor([37]))
        padded, padded_lens = model(batch, torch.tensor([80, 37]))
    n = int(alone_len)
    assert padded_lens[1] == n
    torch.testing.assert_close(padded[1, :n], alone[0, :n], atol=1e-5, rtol=1e-5)


def test_utterance_cmvn_standardises_real_frames_only():
    feats = torch.randn(2, 50, 20) * 4.0 + 10.0
    lens = torch.tensor([50, 23])
    out = UtteranceCMVN()(feats, lens)
    short = out[1, :23]
    torch.testing.assert_close(short.mean(dim=0), torch.zeros(20), atol=1e-5, rtol=0)
    torch.testing.assert_close(short.pow(2).mean(dim=0), torch.ones(20), atol=1e-3, rtol=0)
    assert torch.equal(out[1, 23:], torch.zeros(27, 20))


def test_output_ignores_voice_level_and_tilt():
    """A louder voice (+ constant in log-mel) with another spectral tilt (+ per-bin constant)
    and a wider range (x per-bin gain) gives the same output: the input is standardised per bin."""
    model = ConformerCTC(small_cfg(), V).eval()
    feats, lens = torch.randn(2, 60, 20), torch.tensor([60, 41])
    tilt, gain = torch.linspace(-3.0, 5.0, 20), torch.linspace(0.5, 2.0, 20)
    with torch.no_grad():
        a, _ = model(feats, lens)
        b, _ = model(feats * gain + tilt + 7.0, lens)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_log_softmax_float32_under_autocast():
    model = ConformerCTC(small_cfg(), V).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs, _ = model(torch.randn(2, 30, 20), torch.tensor([30, 20]))
    assert log_probs.dtype == torch.float32


# ----------------------------------------------------------------------------- CTC


def test_min_ctc_frames():
    assert min_ctc_frames([]) == 0
    assert min_ctc_frames([1, 2, 3]) == 3
    assert min_ctc_frames([1, 1]) == 3
    assert min_ctc_frames([1, 1, 1, 2, 2]) == 8


def test_ctc_loss_excludes_unalignable():
    log_probs = torch.randn(4, 6, 5).log_softmax(-1).requires_grad_()
    out_lens = torch.tensor([6, 2, 2, 3])
    targets = torch.tensor(
        [
            [1, 2, 3, -1],  # 3 labels in 6 frames: fine
            [1, 1, -1, -1],  # "aa" needs 3 frames, has 2: unalignable
            [1, 2, -1, -1],  # "ab" needs 2 frames, has 2: fine
            [1, 2, 3, 4],  # 4 labels in 3 frames: unalignable
        ]
    )
    target_lens = torch.tensor([3, 2, 2, 4])
    loss, n_bad, mask = ctc_loss(log_probs, out_lens, targets, target_lens)
    assert n_bad == 2
    assert mask.tolist() == [True, False, True, False]
    assert torch.isfinite(loss)
    raw = F.ctc_loss(log_probs.transpose(0, 1), targets.clamp(min=0), out_lens, target_lens, reduction="none")
    assert torch.isinf(raw[[1, 3]]).all() and torch.isfinite(raw[[0, 2]]).all()  # criterion is exact
    ref = F.ctc_loss(
        log_probs[[0, 2]].transpose(0, 1),
        targets[[0, 2]].clamp(min=0),
        out_lens[[0, 2]],
        target_lens[[0, 2]],
        reduction="sum",
    )
    torch.testing.assert_close(loss, ref)
    loss.backward()
    assert log_probs.grad[[1, 3]].abs().sum() == 0
    assert torch.isfinite(log_probs.grad).all()


def test_ctc_loss_all_alignable_equals_torch_sum():
    log_probs = torch.randn(3, 8, 6).log_softmax(-1)
    out_lens = torch.tensor([8, 7, 5])
    targets = torch.tensor([[1, 2, 2, 3], [4, 5, 0, 0], [3, 0, 0, 0]])  # 0-padded
    target_lens = torch.tensor([4, 2, 1])
    loss, n_bad, mask = ctc_loss(log_probs, out_lens, targets, target_lens)
    assert n_bad == 0 and mask.all()
    ref = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lens, target_lens, reduction="sum")
    torch.testing.assert_close(loss, ref)


def test_ctc_loss_none_alignable_is_zero_with_grad():
    log_probs = torch.randn(2, 2, 4).log_softmax(-1).requires_grad_()
    loss, n_bad, mask = ctc_loss(
        log_probs, torch.tensor([2, 1]), torch.tensor([[1, 2, 3], [1, 1, -1]]), torch.tensor([3, 2])
    )
    assert n_bad == 2 and not mask.any()
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert log_probs.grad.abs().sum() == 0


# ----------------------------------------------------------------------------- decoding, metrics


def test_greedy_decode():
    # frame argmaxes: utt0 = 1 1 0 1 2 2 0 -> [1, 1, 2]; utt1 = 0 3 3 3 | padding 1 1 1
    paths = [[1, 1, 0, 1, 2, 2, 0], [0, 3, 3, 3, 1, 1, 1]]
    log_probs = F.one_hot(torch.tensor(paths), 4).float().mul(5).log_softmax(-1)
    assert greedy_decode(log_probs, torch.tensor([7, 4])) == [[1, 1, 2], [3]]
    assert greedy_decode(log_probs, torch.tensor([0, 1])) == [[], []]


def test_cer_wer():
    assert cer(["abc"], ["abd"]) == pytest.approx(1 / 3)
    assert cer(["abc", "de"], ["abc", ""]) == pytest.approx(2 / 5)
    assert cer(["ab"], ["xaby"]) == pytest.approx(1.0)  # insertions can push past 0.5
    assert wer(["the cat sat"], ["the bat sat down"]) == pytest.approx(2 / 3)
    assert wer(["a b", ""], ["a b", "c"]) == pytest.approx(1 / 2)  # empty ref: insertions count
    assert cer([""], [""]) == 0.0 and cer([""], ["x"]) == 1.0
    assert math.isclose(wer([], []), 0.0)
    with pytest.raises(ValueError):
        cer(["a"], [])


# ----------------------------------------------------------------------------- learning


def test_tiny_overfit():
    torch.manual_seed(0)
    cfg = small_cfg(input_dim=16, d_model=32, n_layers=1, ff_dim=64, subsampling=4)
    model = ConformerCTC(cfg, vocab_size=6).train()
    feats, feat_lens = torch.randn(1, 60, 16), torch.tensor([60])
    targets, target_lens = torch.tensor([[3, 1, 4]]), torch.tensor([3])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        log_probs, out_lens = model(feats, feat_lens)
        loss, n_bad, _ = ctc_loss(log_probs, out_lens, targets, target_lens)
        assert n_bad == 0
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])
    model.eval()
    with torch.no_grad():
        assert greedy_decode(*model(feats, feat_lens)) == [[3, 1, 4]]


def test_utterance_cmvn_is_not_squeezed_by_digital_silence():
    """Exact zeros around an utterance (fbank: log(FLT_EPSILON) in every bin) must not squeeze its sound frames
    into a narrow band; the sound frames keep about the spread they have when the zeros are not there."""
    from asrlab.data.audio import fbank

    g = torch.Generator().manual_seed(0)
    t = torch.arange(8000) / 16000.0
    sound = 0.3 * torch.sin(2 * math.pi * 440.0 * t) * (1 + torch.sin(2 * math.pi * 3.0 * t)) + 0.01 * torch.randn(
        8000, generator=g
    )
    alone = fbank(sound, 16000)
    padded = fbank(torch.cat([torch.zeros(4800), sound, torch.zeros(4800)]), 16000)
    assert padded.min() < -15.0  # the zeros are there, as Kaldi fbank makes them
    cmvn = UtteranceCMVN()
    spread_alone = cmvn(alone[None], torch.tensor([len(alone)]))[0].std(dim=0).mean()
    out = cmvn(padded[None], torch.tensor([len(padded)]))[0]
    loud = padded.mean(dim=1) > -15.0  # frames with sound in them
    spread_padded = out[loud].std(dim=0).mean()
    assert spread_padded > 0.5 * spread_alone, (float(spread_padded), float(spread_alone))
