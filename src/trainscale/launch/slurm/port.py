"""``python -m trainscale.launch.slurm.port``: kept for batch scripts rendered by earlier versions;
the port check itself is :func:`trainscale.launch.ports.main`."""

from trainscale.launch.ports import choose, main

__all__ = ["choose", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
