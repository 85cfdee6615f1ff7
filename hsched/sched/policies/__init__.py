"""The policies, one per file, over one contract (`base`: what a policy is given and answers, and the hooks the round
reads instead of testing a policy's class): `hsched` (the team's own, the live default), and the references it is
measured against: `fifo`, `las` (and las-hetero), `ftf`, `backfill`, `oracle` (clairvoyant). Names to classes:
hsched.sched.registry."""
