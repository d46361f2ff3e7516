"""``attnkit tour``: train the mechanisms on generated tasks side by side (experiments, training, runner, report).

The experiments API the runner uses: :func:`experiments`, :func:`default_set`, :func:`run`,
with :class:`Experiment` and :class:`Result`.
"""

from .experiments import Experiment, default_set, experiments, run
from .train import Budget, Result

__all__ = ["Budget", "Experiment", "Result", "default_set", "experiments", "run"]
