"""Shared by the course-style scripts: an MNIST-shaped data set written to disk once (what
`datasets.MNIST(..., download=True)` does in the seeds, without a network), and a checksum."""

import hashlib
import os

import torch


def download(root: str, n: int = 256) -> str:
    """Write the data set under ``root`` unless it is there (the seeds' download step)."""
    path = os.path.join(root, "digits.pt")
    if not os.path.exists(path):
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(n, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save({"x": x, "y": y}, tmp)
        os.replace(tmp, path)
    return path


def load(root: str) -> torch.utils.data.TensorDataset:
    data = torch.load(os.path.join(root, "digits.pt"), weights_only=True)
    return torch.utils.data.TensorDataset(data["x"], data["y"])


def checksum(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def report(out_dir: str, **fields) -> None:
    """One JSON file per rank, read by the tests (tests/conformance/test_conformance.py)."""
    import importlib.util
    import json

    os.makedirs(out_dir, exist_ok=True)
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
             "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURMD_NODENAME",
             "TORCHELASTIC_RESTART_COUNT", "JOB_SETUP_MARK")
    fields["env"] = {k: os.environ.get(k) for k in names}
    fields["trainscale_importable"] = importlib.util.find_spec("trainscale") is not None
    with open(os.path.join(out_dir, f"rank-{fields['rank']}.json"), "w") as fh:
        json.dump(fields, fh)
