"""``attnkit tour --suite long``: the long-range suite and the LRA picture.

Every long-sequence mechanism of the library (:mod:`.roster`) as the same encoder (:mod:`.model`,
matched parameter count) trained with the same budget per task on generated long-range tasks
(:mod:`.suite`: a CPU scale whose tasks a small model learns in minutes, and Long Range Arena's
scale, Tay et al. 2020, arXiv:2011.04006), one fresh process per (task, mechanism) at one thread
(:mod:`.train`, :mod:`.jobs`, :mod:`.runner`), plus a speed and memory measurement at the longest
length (:mod:`.speed`). The report (:mod:`.report`, :mod:`.picture`) draws accuracy against training
speed with memory as bubble size (LRA's Figure 3) and decides the papers' orderings from the seeds'
spread (:mod:`.claims`, :mod:`attnkit.lab.tour.welch`); :mod:`.estimate` gives a scale's time from its counted FLOPs.
"""

from .roster import MECHANISMS, Mechanism, mechanism
from .runner import SuiteSummary, run_suite
from .suite import SCALES, TASKS, plan

__all__ = ["MECHANISMS", "Mechanism", "mechanism", "run_suite", "SuiteSummary", "TASKS", "SCALES", "plan"]
