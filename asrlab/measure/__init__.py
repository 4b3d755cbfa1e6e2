"""Offline measurement tools, above the trainer: the training-throughput sweep (``tune``), loader
throughput (``loader_bench``), the time to the first batch after a resume (``resume_time``) and memory
(``memory``). The step timer a running loop uses is a part: :mod:`asrlab.lab.timing`.

Nothing is imported here: each tool brings what it measures (the trainer, the loader) only when used.
"""
