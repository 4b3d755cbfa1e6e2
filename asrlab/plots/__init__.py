"""Plot helpers the notebooks call in one line; each returns a matplotlib Figure."""

from .data import SWEEP_MEASURES, durations, samplers, spectrogram, sweep_heatmap, sweep_heatmaps
from .runs import (
    coverage_grid,
    fix_comparison,
    headroom_bars,
    module_trace,
    nan_traces,
    resume_curves,
    resume_times,
    training_curves,
)
from .stalls import (
    HELD,
    PHASE_COLOURS,
    SHARE_LABELS,
    STEP_PHASES,
    held_ranks,
    phase_shares,
    rank_steps,
    step_breakdown,
    timeline,
)

__all__ = [
    "HELD",
    "PHASE_COLOURS",
    "SHARE_LABELS",
    "STEP_PHASES",
    "SWEEP_MEASURES",
    "coverage_grid",
    "durations",
    "fix_comparison",
    "headroom_bars",
    "held_ranks",
    "module_trace",
    "nan_traces",
    "phase_shares",
    "rank_steps",
    "resume_curves",
    "resume_times",
    "samplers",
    "spectrogram",
    "step_breakdown",
    "sweep_heatmap",
    "sweep_heatmaps",
    "timeline",
    "training_curves",
]
