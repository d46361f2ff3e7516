"""Train a small language model with its sequence split over the ranks, and the same model on one process.

    torchrun --nproc-per-node 4 examples/sequence_parallel_lm.py [--scheme ring] [--layout zigzag] [--steps 20]

The code is the package's own module, :mod:`attnkit.distributed.lm_example`, so that an installed
wheel runs it too (``torchrun --nproc-per-node 4 -m attnkit.distributed.lm_example``); read it there.
"""

from attnkit.distributed.lm_example import main

if __name__ == "__main__":
    main()
