"""Launching: local workers through torch's elastic agent, and SLURM batch jobs.

The package is also callable: ``trainscale.launch(fn, *args, nproc=N)`` runs ``fn(*args)`` on N local
ranks (launch/function.py). Python sets ``trainscale.launch`` to this package as soon as anything imports
a module of it, so the function cannot be a plain attribute of ``trainscale``: the package's module
object calls it instead. Standard library only here (the job kit copies this file).
"""

import sys
import types


class _Launch(types.ModuleType):
    def __call__(self, fn, /, *args, **options):
        from trainscale.launch.function import launch  # noqa: PLC0415 (job kit)

        return launch(fn, *args, **options)


sys.modules[__name__].__class__ = _Launch
