"""What a job asks: arrays, batch scripts, constraints, dependencies, output files, job ids."""
