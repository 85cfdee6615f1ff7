"""The protocol the node helper speaks (its number in `whoami` and `probe`)."""


HELPER_VERSION = 3
"""The protocol this helper speaks, in `whoami` and `probe`; executors refuse a node whose helper says less
(an installed helper is not theirs to replace). 2: lab mode through an installed helper (issue 13);
3: sbatch's -o/-e written by the wrapper (a helper of 2 dropped them), datasets, the launcher's options final
and its commands listed one by one in the sudo rule, copies as data only (safefiles: pack/unpack take the job's
user, data_read a dataset's root and a relative path). Raise it whenever a request gains a key an older helper
would ignore."""
