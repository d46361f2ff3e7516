import torch

# Tests use tiny tensors, where OpenMP's thread start-up costs more than the work
# (and thrashes when the machine is shared); one thread keeps the suite fast.
torch.set_num_threads(1)
torch.manual_seed(0)
