"""A persistent pool of torch.distributed ranks (the pool, its fork server and one rank's worker), as one unit."""
