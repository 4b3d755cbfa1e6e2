"""What the lines of any log mean, whatever toolkit or launcher wrote them: each toolkit's step lines
(:mod:`.toolkits`), and in any of them failures, timeouts, tracebacks, out-of-memory, loss-scale messages, signals and
resumes (:mod:`.words`, :mod:`.events`, :mod:`.tracebacks`), the format recognised from the lines themselves.
:func:`.reader.read_logs` reads files of any size into a :class:`.run.LogRun`; :mod:`..sources.text_log` turns it
into the events of the doctor's one timeline."""
