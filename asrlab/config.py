"""Configs: shipped YAML files (``asrlab/conf/*.yaml``) read into dataclasses, with dotted overrides.

``load_config("tiny", ["data.num_workers=2", "optim.lr=0.002"])``: a name is a shipped config,
anything else a path. Every key must exist in its dataclass; a typo is an error, not a silent
default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from .data.config import DataConfig
from .errors import UsageError
from .files import atomic_write

CONF_DIR = Path(__file__).parent / "conf"


@dataclass
class ModelConfig:
    """Hyper-parameters of ``ConformerCTC``. The defaults are the *tiny* model
    (about 2.5M parameters with a ~30-symbol vocabulary) that trains on 2 CPU cores.

    A WeNet-like *base* model is ``ModelConfig(d_model=256, n_heads=4, n_layers=12,
    ff_dim=2048, conv_kernel=15, subsampling=4)``.
    """

    input_dim: int = 80  # fbank bins per frame
    d_model: int = 144  # model width D
    n_heads: int = 4  # attention heads; d_model % n_heads == 0
    n_layers: int = 4  # Conformer blocks
    ff_dim: int = 576  # hidden width of each (macaron) feed-forward
    conv_kernel: int = 15  # depthwise conv kernel (frames after subsampling), odd
    subsampling: int = 2  # time subsampling factor: 2 or 4
    pos_enc: str = "rel"  # "rel" (Transformer-XL style) or "abs" (sinusoidal)
    dropout: float = 0.1  # one dropout rate used everywhere
    conv_channels: int = 0  # channels of the conv front end; 0: d_model (WeNet). The x2 front end
    #                         runs at full time resolution, so fewer channels make it much cheaper

    def __post_init__(self) -> None:
        for name in ("input_dim", "d_model", "n_heads", "n_layers", "ff_dim", "conv_kernel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if isinstance(self.conv_channels, bool) or not isinstance(self.conv_channels, int) or self.conv_channels < 0:
            raise UsageError(f"ModelConfig.conv_channels must be an int >= 0 (0: d_model), got {self.conv_channels!r}")
        if self.input_dim < 7:
            raise UsageError(
                f"ModelConfig.input_dim must be >= 7 (two 3x3 stride-2 convs run over it), got {self.input_dim}"
            )
        if self.d_model % self.n_heads != 0:
            raise UsageError(f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.d_model % 2 != 0:
            raise UsageError(f"ModelConfig.d_model must be even (sin/cos positional encoding), got {self.d_model}")
        if self.conv_kernel % 2 != 1:
            raise UsageError(f"ModelConfig.conv_kernel must be odd (symmetric 'same' padding), got {self.conv_kernel}")
        if self.subsampling not in (2, 4):
            raise UsageError(f"ModelConfig.subsampling must be 2 or 4, got {self.subsampling!r}")
        if self.pos_enc not in ("rel", "abs"):
            raise UsageError(f"ModelConfig.pos_enc must be 'rel' or 'abs', got {self.pos_enc!r}")
        if (
            isinstance(self.dropout, bool)
            or not isinstance(self.dropout, (int, float))
            or not (0.0 <= self.dropout < 1.0)
        ):
            raise UsageError(f"ModelConfig.dropout must be a float in [0, 1), got {self.dropout!r}")


@dataclass
class OptimConfig:
    lr: float = 2e-3  # peak learning rate, reached at the end of warm-up
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.98)
    warmup_steps: int = 150  # optimizer steps of linear warm-up
    decay: str = "cosine"  # after warm-up: "cosine" to min_lr at max_steps, "noam" (WeNet), "none"
    decay_by_clock: bool = False  # cosine ends at min_lr by whichever limit stops the run first:
    #                                  train.max_steps, train.max_minutes, or train.max_epochs (its steps
    #                                  estimated by the pre-flight layout); the quickstart uses it
    min_lr: float = 1e-5
    grad_clip: float = 5.0  # max global gradient norm (after unscaling); 0: no clipping
    accum_steps: int = 1  # micro-batches per optimizer step


@dataclass
class TrainConfig:
    max_epochs: int = 10
    max_steps: int = 0  # optimizer steps; 0: no limit (max_epochs decides)
    max_minutes: float = 0.0  # stop after this much training wall-clock, summed over resumes; 0: no limit
    precision: str = "auto"  # auto | fp32 | fp16 | bf16
    seed: int = 0
    save_every_steps: int = 0  # 0: only at epoch ends
    keep_last: int = 3
    eval_every_epochs: int = 1
    log_every_steps: int = 10
    tensorboard: bool = False
    progress: bool = True  # tqdm bar on rank 0 (only when a terminal or notebook shows it)
    backend: str = "auto"  # auto (nccl on GPUs, gloo on CPU) | nccl | gloo
    uneven: str = "stop"  # ranks with unequal data: stop (all stop at the first rank's end) | join | none
    stall_timeout_s: float = 30.0  # watchdog: no rank progressed for this long -> report and exit; 0: off
    first_step_timeout_s: float = 180.0  # the same, until every rank has finished its first step
    timeline: bool = False  # record every phase change (EXP/heartbeat/rank*.timeline.jsonl)
    preflight: bool = True  # check at start how the data falls on ranks (warns about uneven layouts)
    trace_steps: int = 0  # torch.profiler: record this many steps to EXP/trace/rank{R}/ (0: off)
    trace_from: int = 10  # ... starting at this step of the run (1-based)
    resume_mode: str = "exact"  # exact | epoch_start (WeNet: the epoch starts over at batch 0) |
    #                                  reshuffle (a new shuffle seed, then skip the batches already trained)
    ledger: bool = False  # write the utterance keys of every step to EXP/ledger/rank{R}.jsonl
    loss_scaling: bool = True  # fp16: dynamic loss scaling (GradScaler); false: fp16 without it
    diagnostics_every: int = 50  # per-module fp16 headroom to EXP/diagnostics/ every N steps (0: off)
    nonfinite: str = "skip"  # a step whose loss or gradients are not finite: skip | rollback | halt
    rollback_lr_factor: float = 0.5  # rollback: reload the last checkpoint and multiply the LR by this
    max_rollbacks: int = 3  # ... at most this many times, then halt
    # torch.compile of the model (with DDP: of the wrapper); off by default: on CPU compiling takes minutes
    # (benchmarks/compile_cpu.txt). Sampled steps and a non-finite step's replay run the model eagerly.
    compile: bool = False
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune
    compile_backend: str = "inductor"  # inductor | aot_eager (traced, not code-generated: the CPU tests)
    # each compiled batch's frames padded up to a multiple of this, its length then static and only its size
    # dynamic: one graph per length bucket. Lengths left symbolic (0), inductor failed on a GPU to generate the
    # relative-position attention's code (docs/gpu.md). The model ignores padded frames.
    compile_pad_frames: int = 256

    def __post_init__(self):
        if self.uneven not in ("stop", "join", "none"):
            raise UsageError(f"train.uneven must be stop, join or none, not {self.uneven!r}")
        if self.nonfinite not in ("skip", "rollback", "halt"):
            raise UsageError(f"train.nonfinite must be skip, rollback or halt, not {self.nonfinite!r}")
        if self.resume_mode not in ("exact", "epoch_start", "reshuffle"):
            raise UsageError(f"train.resume_mode must be exact, epoch_start or reshuffle, not {self.resume_mode!r}")
        if self.compile_mode not in ("default", "reduce-overhead", "max-autotune"):
            raise UsageError(
                f"train.compile_mode must be default, reduce-overhead or max-autotune, not {self.compile_mode!r}"
            )
        if self.compile_backend not in ("inductor", "aot_eager", "eager"):
            raise UsageError(
                f"train.compile_backend must be inductor, aot_eager or eager, not {self.compile_backend!r}"
            )
        if self.compile_pad_frames < 0:
            raise UsageError(
                f"train.compile_pad_frames must be 0 (lengths dynamic) or more, not {self.compile_pad_frames}"
            )
        if self.backend not in ("auto", "nccl", "gloo"):
            raise UsageError(f"train.backend must be auto, nccl or gloo, not {self.backend!r}")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)


def _build(cls, values: dict, where: str):
    known = {f.name for f in fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise UsageError(
            f"unknown config key(s) {', '.join(sorted(f'{where}.{k}' for k in unknown))}; "
            f"{where} has: {', '.join(sorted(known))}"
        )
    defaults = {f.name: f.default for f in fields(cls)}
    return cls(**{k: _coerce(f"{where}.{k}", v, defaults[k]) for k, v in values.items()})


def _coerce(key: str, value, default):
    """Lists become tuples; a number where the default is a float becomes a float, and a string too
    (YAML 1.1 reads ``1e-3`` as a string); anything else that cannot be is an error naming the key."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(default, float) and not isinstance(value, bool) and isinstance(value, (int, str)):
        try:
            return float(value)
        except ValueError:
            raise UsageError(f"{key} must be a number, not {value!r}") from None
    return value


def config_from_dict(d: dict) -> Config:
    sections = {f.name: f for f in fields(Config)}
    unknown = set(d) - set(sections)
    if unknown:
        raise UsageError(f"unknown config section(s) {', '.join(sorted(unknown))}; sections: {', '.join(sections)}")
    return Config(
        **{name: _build(f.default_factory().__class__, d.get(name) or {}, name) for name, f in sections.items()}
    )


def apply_overrides(d: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` strings (values parsed as YAML) to a config dict."""
    d = {k: dict(v or {}) for k, v in d.items()}
    for o in overrides:
        key, sep, value = o.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise UsageError(f"override {o!r} is not SECTION.KEY=VALUE (e.g. optim.lr=0.002)")
        d.setdefault(section, {})[name] = yaml.safe_load(value)
    return d


def load_config(name_or_path: str | Path = "tiny", overrides: list[str] = ()) -> Config:
    path = Path(name_or_path)
    if not path.suffix and (CONF_DIR / f"{name_or_path}.yaml").exists():
        path = CONF_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        shipped = ", ".join(p.stem for p in sorted(CONF_DIR.glob("*.yaml")))
        raise UsageError(f"no config {str(name_or_path)!r}: give a YAML path or a shipped name ({shipped})")
    raw = yaml.safe_load(path.read_text()) or {}
    cfg = config_from_dict(apply_overrides(raw, list(overrides)))
    return cfg


def dump_config(cfg: Config, path: Path) -> None:
    """Written whole or not at all (a monitor may read it while the run starts)."""
    atomic_write(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def replace_section(cfg: Config, section: str, **changes) -> Config:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})
