"""`python -m tailguard.bench ...` is `tailguard bench ...`."""

from tailguard.cli import bench

if __name__ == "__main__":
    bench(prog_name="python -m tailguard.bench")
