"""Offline text for the language-model workloads: Python's own documentation, byte-level tokens.

`pydoc_data.topics` ships with CPython (about 0.8 MB of English prose and code), so the LM
workloads train without a network. Users with a hub can load a HF dataset instead.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from pydoc_data.topics import topics

import torch

from trainscale.checkpoint import atomic_torch_save
from trainscale.errors import ConfigError

VOCAB = 256  # bytes


def builtin_corpus() -> str:
    return "\n\n".join(topics[key] for key in sorted(topics))


def hub_texts(
    name: str, split: str = "train", field: str = "text", limit: int = 20000
) -> list[str]:  # pragma: no cover
    """Texts from a HF dataset (needs `datasets` and a network)."""
    try:
        from datasets import load_dataset  # noqa: PLC0415 (optional dependency)
    except ImportError:
        raise ConfigError("--hub-dataset needs the 'datasets' package", hint="pip install datasets") from None
    return list(load_dataset(name, split=split)[field][:limit])


def encode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)


def decode(tokens: torch.Tensor) -> str:
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def windows(tokens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping (seq_len + 1)-token windows: inputs are [:-1], targets [1:]."""
    n = (tokens.numel() - 1) // seq_len
    if n < 1:
        raise ConfigError(
            f"the corpus has {tokens.numel()} tokens, fewer than --seq-len {seq_len} + 1",
            hint="use a shorter --seq-len",
        )
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return tokens[idx]


def hub_encode(tokenizer_name: str, text: str) -> tuple[torch.Tensor, int]:
    """Token ids from a HF tokenizer (a hub name or a directory written by ``save_pretrained``) and its
    vocabulary size."""
    try:
        from transformers import AutoTokenizer  # noqa: PLC0415 (optional dependency)
    except ImportError:
        raise ConfigError("--tokenizer needs the 'transformers' package", hint="pip install transformers") from None
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    ids = [i for chunk in text.split("\n\n") for i in tokenizer(chunk + "\n\n")["input_ids"]]
    return torch.tensor(ids, dtype=torch.int64), len(tokenizer)


def prepare(
    cache_dir: Path, text_source: str = "builtin", val_fraction: float = 0.1, tokenizer: str | None = None
) -> Path:
    """Tokenize once into ``cache_dir`` (call on rank 0 inside ``rank_zero_first``); returns the file.
    Bytes (vocabulary 256) unless ``tokenizer`` names a HF tokenizer."""
    text = builtin_corpus() if text_source == "builtin" else "\n\n".join(hub_texts(text_source))
    digest = hashlib.sha256(f"{tokenizer or 'bytes'}\0{text}".encode()).hexdigest()[:12]
    path = Path(cache_dir) / f"tokens-{digest}.pt"
    if not path.exists():
        tokens, vocab = (encode(text), VOCAB) if tokenizer is None else hub_encode(tokenizer, text)
        split = int(tokens.numel() * (1 - val_fraction))
        atomic_torch_save({"train": tokens[:split].clone(), "val": tokens[split:].clone(), "vocab": vocab}, path)
    return path


def load(path: Path) -> dict:
    """{"train": ids, "val": ids, "vocab": size}."""
    data = torch.load(path, weights_only=True)
    data.setdefault("vocab", VOCAB)  # caches written before the vocabulary was recorded held bytes
    return data
