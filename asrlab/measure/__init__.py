"""Measurement: where a step's time goes and what the machine does meanwhile (``profiling``), the
training-throughput sweep (``tune``), loader throughput (``loader_bench``) and the time to the first
batch after a resume (``resume_time``).

Nothing is imported here: ``profiling`` is used by the trainer, while ``tune`` and ``resume_time``
use the trainer, so importing them eagerly would make a cycle.
"""
