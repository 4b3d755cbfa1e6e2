"""What the lines of any log mean, whatever wrote them: each toolkit's step lines (:mod:`.toolkits`); failures,
tracebacks, out-of-memory, loss-scale messages, signals and resumes (:mod:`.words`, :mod:`.events`,
:mod:`.tracebacks`). :func:`.reader.read_logs` reads files of any size into a :class:`.run.LogRun`."""
