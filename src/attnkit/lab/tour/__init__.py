"""``attnkit tour``: train the mechanisms on generated tasks side by side.

``experiments/`` defines and trains the runs (the catalog, the objectives, the training
loop), :mod:`.runner` runs them, each in a fresh process (:mod:`.child`), :mod:`.store` saves
and loads finished runs (shared with the long-range suite, ``long/``), ``report/`` writes the
report folder from them, and :mod:`.catalogue` says which registry entries the tour trains and
why the others are left out. The experiments API the runner uses: :func:`experiments`,
:func:`default_set`, :func:`run`, with :class:`Experiment` and :class:`Result`.
"""

from .experiments import Experiment, default_set, experiments, run
from .experiments.train import Budget, Result

__all__ = ["Budget", "Experiment", "Result", "default_set", "experiments", "run"]
