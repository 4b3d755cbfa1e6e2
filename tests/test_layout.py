"""The package's shape: imports run one way (data and model at the bottom, the parts in ``lab`` above them,
the trainer, the doctor and the offline tools above the parts, the notebooks' helpers and the CLI on top),
no circle between modules, and no module too long to read."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "asrlab"

# what each room may import of the package's own (besides itself)
BASE = {"errors", "files"}
ALLOWED = {
    "errors": set(),
    "files": set(),
    "data": BASE,
    "config": BASE | {"data"},
    "model": BASE | {"config"},
    "scoring": BASE | {"model"},
    "lexicon": BASE,
    "lab": BASE,  # the parts stand on nothing of asrlab's model: any loop's model is the loop's
    "train": BASE | {"data", "model", "scoring", "config", "lab"},
    "doctor": BASE | {"data", "lab"},
    "watch": BASE | {"lab", "doctor"},
    "decode": BASE | {"data", "model", "scoring", "config", "lexicon", "lab", "train"},
    "measure": BASE | {"data", "model", "config", "lab", "train"},
    "plots": BASE | {"lab"},
    "widgets": BASE | {"data", "model", "scoring", "lab", "doctor", "decode", "plots"},
    "nb": BASE | {"lab", "train", "doctor", "widgets"},
    "runner": BASE | {"lab", "nb", "widgets"},
    "cli": None,  # the top: anything
}
LONGEST = 500  # lines; the model stays one file (nanoGPT's habit)


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, bool]]:
    """The package's own modules ``mod`` imports, each with whether the import sits at module level."""
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = (
                ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                if node.level
                else (node.module or "")
            )
            names = [f"{base}.{a.name}" for a in node.names]
            targets = [n if n in mods else base for n in names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        out += [(t, id(node) in top) for t in targets if t == "asrlab" or t.startswith("asrlab.")]
    return out


def _room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "asrlab"


def test_imports_run_one_way():
    mods = _modules()
    wrong = []
    for mod, path in sorted(mods.items()):
        room = _room(mod)
        allowed = ALLOWED.get(room, "unlisted")
        for target, _ in _imports(mod, path, mods):
            there = _room(target)
            if allowed == "unlisted":
                wrong.append(f"{mod}: room {room!r} is not in the layout's table")
                break
            if allowed is not None and there not in allowed | {room, "asrlab"}:
                wrong.append(f"{mod} imports {target} ({room} -> {there})")
    assert not wrong, "\n".join(wrong)


def test_the_parts_stand_alone_and_the_trainer_stands_on_them():
    """No module of ``lab`` imports the trainer, the watcher, the doctor or asrlab's model; the trainer reaches
    the parts only through ``lab`` (it has no copies of its own of the watch, the guards or the run state)."""
    mods = _modules()
    for mod, path in mods.items():
        if _room(mod) == "lab":
            assert not {_room(t) for t, _ in _imports(mod, path, mods)} & {
                "train",
                "watch",
                "doctor",
                "measure",
                "cli",
                "model",
            }, mod
    train = {_room(t) for m, p in mods.items() if _room(m) == "train" for t, _ in _imports(m, p, mods)}
    assert "lab" in train
    # through the parts' public face (``asrlab.lab``'s names, its ``dist`` and ``layout`` modules), as a
    # user's loop would: what the trainer needs and the face lacks, the face grows
    inner = sorted(
        f"{m} imports {t}"
        for m, p in mods.items()
        if _room(m) == "train"
        for t, _ in _imports(m, p, mods)
        if _room(t) == "lab" and t not in {"asrlab.lab", "asrlab.lab.dist", "asrlab.lab.layout"}
    )
    assert not inner, "\n".join(inner)
    names = {p.stem for p in (PKG / "train").glob("*.py")}
    assert not names & {"stall", "heartbeat", "relay", "uneven", "nonfinite", "checkpoint", "ledger", "state"}, names


def test_no_circle_between_modules():
    """Module-level imports form no cycle (an import inside a function would only hide one)."""
    mods = _modules()
    graph = {m: {t for t, top in _imports(m, p, mods) if t in mods and t != m} for m, p in mods.items()}
    # a package's __init__ importing its own submodules is how a package shows its names, not a circle
    for m in graph:
        graph[m] = {t for t in graph[m] if not t.startswith(m + ".")}
    seen, on_path, circles = set(), [], []

    def visit(m):
        if m in on_path:
            circles.append(on_path[on_path.index(m) :] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for t in sorted(graph[m]):
            visit(t)
        on_path.pop()

    for m in sorted(graph):
        visit(m)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_no_module_too_long_to_read():
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > LONGEST and p.name != "model.py"
    }
    assert not long, long


def test_no_test_module_imports_another():
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    wrong = []
    for p in (ROOT / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            wrong += [f"{p.name} imports {n}" for n in names if n.split(".")[0] in tests]
    assert not wrong, wrong


def test_the_run_folders_layout_is_named_in_one_place():
    """Every file and folder of EXP is named in ``asrlab/lab/layout.py``: nowhere else is one of them joined
    onto a path by hand (``exp / "stall_report.json"``)."""
    from asrlab.lab import layout

    names = {getattr(layout, n) for n in layout.__all__ if n.isupper() and isinstance(getattr(layout, n), str)}
    joined = []
    for mod, path in _modules().items():
        if mod == "asrlab.lab.layout":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant)
                and node.right.value in names
            ):
                joined.append(f"{path.relative_to(ROOT)}:{node.lineno}: / {node.right.value!r}")
    assert not joined, "\n".join(joined)
