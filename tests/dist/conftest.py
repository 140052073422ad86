"""The test process forks the dist tests' workers, so it must not hold an OpenMP thread pool:
a child forked after the parent ran a multi-threaded torch op (the Hugging Face round trip's
forward, say) can hang in its first parallel region. One intra-op thread in the parent, as in
every worker, keeps forking safe whatever ran before."""

import torch

torch.set_num_threads(1)
