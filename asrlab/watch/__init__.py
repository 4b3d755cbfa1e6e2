"""The zero-line watcher: ``asrlab watch -- CMD`` runs any training command as it is and watches every
rank and DataLoader worker of it from outside (:mod:`.watcher`): stacks sampled (:mod:`.sample`),
classified into the phases of a step (:mod:`asrlab.lab.stall.classify`), the ranks found as they start
(:mod:`.procs`).
What it writes into EXP is what ``asrlab doctor`` reads of any run."""
