"""The Slurm executor: a Slurm partition as hsched nodes (executor), reached on a login node (login),
the site's conventions (site) and Slurm's text formats (text)."""
