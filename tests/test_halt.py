"""The halt policy in a loop of the user's own (not asrlab's example): the exception and the exit code the
docs promise, and the doctor's verdict on what the loop left."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from asrlab.doctor import diagnose
from asrlab.doctor import diagnose_logs

LOOP = textwrap.dedent("""
    import math, sys
    import torch
    from asrlab import lab

    exp, catch = sys.argv[1], sys.argv[2] == "catch"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    guard = lab.NumericsGuard(net, exp, policy="halt")
    try:
        for step in range(1, 6):
            x = torch.randn(4, 3) * (math.inf if step == 3 else 1.0)
            batch = (x, [f"clip{step}-{i}" for i in range(4)])
            with guard.step(step, batch):
                loss = net(x).pow(2).mean()
                loss.backward()
            guard.optimizer_step(opt, loss, replay=lambda: net(x).pow(2).mean())
            opt.zero_grad()
    except lab.NonFiniteHalt as e:
        if not catch:
            raise
        print("halted:", e, file=sys.stderr)
        sys.exit(e.exit_code)
""")


@pytest.mark.parametrize("catch, code", [("catch", 4), ("raise", 1)])
def test_a_halt_raises_nonfinitehalt_and_exits_with_the_documented_code(tmp_path, catch, code):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    exp = tmp_path / "exp"
    out = subprocess.run([sys.executable, str(script), str(exp), catch], capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr[-2000:]
    assert "halted at step 3" in out.stderr
    (tmp_path / "loop.log").write_text(out.stdout + out.stderr)  # the loop's own output, read after the fact
    logs = diagnose_logs([str(tmp_path / "loop.log")])
    assert logs["verdict"] == "nonfinite" and logs["culprit"]["step"] == 3, logs["summary"]
    d = diagnose(exp)
    assert d["verdict"] == "nonfinite_halt" and not d["ok"], d["summary"]
    assert d["halt"]["step"] == 3 and d["halt"]["keys"] == [f"clip3-{i}" for i in range(4)]
