"""asrlab's own trainer, a client of :mod:`asrlab.lab`: the trainer, its step, schedule, evaluation,
checkpoints, run data and the launcher (torchrun)."""
