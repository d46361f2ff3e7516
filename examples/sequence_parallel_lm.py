"""Train a small language model with its sequence split over the ranks, and the same model on one process.

    torchrun --nproc-per-node 4 examples/sequence_parallel_lm.py [--scheme ring] [--layout zigzag] [--steps 20]

The code is the package's own module, :mod:`attnkit.lab.sequence_parallel_lm`, so that an installed
wheel runs it too (``torchrun --nproc-per-node 4 -m attnkit.lab.sequence_parallel_lm``); read it there.
"""

from attnkit.lab.sequence_parallel_lm import main

if __name__ == "__main__":
    main()
