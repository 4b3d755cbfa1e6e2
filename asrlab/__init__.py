"""asrlab: a Jupyter-first lab for the four ways ASR training goes wrong.

The package computes; the notebooks in ``notebooks/`` orchestrate and plot.
"""

__version__ = "0.1.0"
