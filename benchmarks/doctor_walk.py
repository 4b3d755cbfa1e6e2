"""How far a reader walks to follow ``asrlab doctor`` through one diagnosis: the files and functions of asrlab it
enters, in the order it runs them, for a run folder and for a log.

Each distinct call (caller function -> called function, the first time it happens) is one step of the walk; the
walk's files, collapsed where consecutive steps stay in one file, are its *stays*; a stay in a file the walk had
already left is a *climb back*. A comprehension or a lambda is read where it is written, as part of the function
around it: Python 3.11 runs each in a frame of its own (3.12 inlines comprehensions), which the second line of each
walk counts as steps too. Lines of the doctor: every ``.py`` under ``asrlab/doctor``.

    .venv/bin/python benchmarks/doctor_walk.py [RUN_FOLDER] [LOG]

Without arguments it makes a run folder (a short ``asrlab train`` of the small model on a synthetic corpus) and
reads a real torchrun log from the fixtures.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = str(ROOT / "asrlab")


def _inline(code) -> bool:
    """A comprehension's or a lambda's code: part of the function it is written in."""
    return code.co_name.startswith("<") and code.co_name != "<module>"


def walk(fn, *args, frames: bool = False) -> dict:
    """The walk of ``fn(*args)``; ``frames``: every frame a step, comprehensions' and lambdas' too."""
    seen_edges, steps = set(), []

    def prof(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(PKG):
            return
        if not frames and _inline(frame.f_code):
            return
        caller = frame.f_back
        while not frames and caller is not None and _inline(caller.f_code):
            caller = caller.f_back
        src = (caller.f_code.co_filename, caller.f_code.co_name) if caller else None
        dst = (frame.f_code.co_filename, frame.f_code.co_name)
        if (src, dst) not in seen_edges:
            seen_edges.add((src, dst))
            steps.append(dst[0])

    sys.setprofile(prof)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    stays = [f for i, f in enumerate(steps) if i == 0 or steps[i - 1] != f]
    climbs = sum(1 for i, f in enumerate(stays) if f in stays[:i])
    files = {f for f in steps}
    return {"files": len(files), "functions": len({d for _, d in seen_edges}), "stays": len(stays), "climbs": climbs}


def doctor_lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / "asrlab" / "doctor").rglob("*.py"))


def _entry():
    """The doctor's entry for any path (a design with one entry per kind of path: its two, by what is there)."""
    from asrlab import doctor

    if hasattr(doctor, "SCHEMA"):
        return lambda p: doctor.diagnose([p])
    from asrlab.doctor.logs import diagnose_logs

    return lambda p: doctor.diagnose(p) if doctor.is_run(p) else diagnose_logs([p])


def main(argv: list[str]) -> int:
    diagnose = _entry()

    if argv:
        run, log = argv[0], argv[1] if len(argv) > 1 else None
    else:
        from asrlab.cli import main as cli

        tmp = Path(tempfile.mkdtemp(prefix="asrlab-walk-"))
        assert cli(["synth", str(tmp / "corpus"), "--utts", "32", "--quiet"]) == 0
        run = str(tmp / "exp")
        small = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.ff_dim=64", "data.num_workers=0"]
        data = str(tmp / "corpus" / "train" / "data.list")
        assert cli(["train", "--data", data, "--exp", run, *small, "train.max_steps=6", "train.progress=false"]) == 0
        log = str(ROOT / "tests/fixtures/toolkit_runs/accelerate/sigkill_rank1_step9/console.log")
    diagnose(run), diagnose(log)  # imports and first-use costs out of the walk
    print(f"doctor: {doctor_lines()} lines in {len(list((ROOT / 'asrlab' / 'doctor').rglob('*.py')))} files")
    for label, path in (("run folder", run), ("log", log)):
        if path:
            w, f = walk(diagnose, path), walk(diagnose, path, frames=True)
            print(
                f"{label:10s}: {w['files']} files, {w['functions']} functions, {w['stays']} stays, {w['climbs']} climbs back"
                f" (every frame a step: {f['stays']} stays, {f['climbs']} climbs back)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
