"""Explorers for the notebooks: ipywidgets in a front end, a static figure or table when run headless.

Each notebook shows its explorers in one line (``widgets.stalls(exp)``); each explorer reads what a
run left on disk (or what the notebook computed) and is drawn one of two ways:

* **live** (JupyterLab, Notebook, VS Code): controls (sliders, pickers, buttons) that redraw a figure
  or a table in place. The static view is sent along as the output's fallback, so a saved notebook
  still shows something where widgets are not drawn.
* **static** (``asrlab notebooks``, nbval, or ``ASRLAB_WIDGETS=static``): only the static view, a
  figure or an HTML table; no widget is created, so nothing waits for a front end and no widget
  state lands in an executed notebook.

``ASRLAB_WIDGETS`` chooses: ``static``, ``live``, or ``auto`` (default: live inside an IPython
kernel with ipywidgets installed). The computing lives elsewhere in the package; these modules
only arrange and draw.
"""

from .base import MODE_ENV, Explorer, interactive, progress
from .doctor import DoctorExplorer
from .logs import LogExplorer, log_series
from .monitor import TrainMonitor
from .numerics import NanExplorer
from .resume import ResumeExplorer
from .stalls import StallExplorer
from .sweep import SweepExplorer
from .utterances import UtteranceBrowser

__all__ = [
    "MODE_ENV",
    "interactive",
    "progress",
    "Explorer",
    "TrainMonitor",
    "UtteranceBrowser",
    "StallExplorer",
    "SweepExplorer",
    "NanExplorer",
    "ResumeExplorer",
    "DoctorExplorer",
    "LogExplorer",
    "log_series",
]
