"""The local tier: each host's newest steps on its own disk, restored from it, a peer's, or a buddy copy.

One package so that what belongs to the tier is found in one place (docs/local-tier.md):
- format: a local step on disk (shards file, digest-covered index, commit by rename, which entries to prune);
- saving: continuous saves to the tier, committed once every host wrote its part;
- restoring: the restart's plan (local step or job directory) and the fill of a missing share from a donor;
- buddy: each host keeps its neighbour's newest step, for a model without a data-parallel replica;
- peer: the authenticated HTTP transport of a step between hosts (server and client);
- lineage: which job and line of training a step belongs to, and whether a restart may restore it;
- lock: one live job per local directory (an OS lock held for the life of the process);
- tier: the tier of one run wired from its settings (what the checkpointer holds of it).
"""
