"""What the lines of any log mean, whatever toolkit or launcher wrote them: the per-step lines of WeNet, ESPnet,
icefall, NeMo/Lightning, SpeechBrain, Hugging Face and plain loops (:mod:`.toolkits`), and in any of them
torchrun's failure summary, NCCL's and gloo's timeouts, Python tracebacks, out-of-memory, killed DataLoader
workers, loss-scale messages, signals and resumes (:mod:`.words`, :mod:`.events`, :mod:`.tracebacks`); the format
is recognised from the lines themselves. :func:`.reader.read_logs` reads files of any size into a
:class:`.run.LogRun`; :mod:`..sources.text_log` turns it into the events of the doctor's one timeline.
"""
