"""``attnkit tour``: train the mechanisms on generated tasks side by side.

``experiments/`` defines and trains the runs (the catalog, the objectives, the training
loop), :mod:`.runner` runs and caches them, ``report/`` writes the report folder from the
cache. The experiments API the runner uses: :func:`experiments`, :func:`default_set`,
:func:`run`, with :class:`Experiment` and :class:`Result`.
"""

from .experiments import Experiment, default_set, experiments, run
from .experiments.train import Budget, Result

__all__ = ["Budget", "Experiment", "Result", "default_set", "experiments", "run"]
