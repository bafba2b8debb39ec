"""README's `--strategy` table: every spelling it lists is one trainscale's own preflight accepts (each one
also runs end to end in tests/integration: test_strategies*, test_shm_allreduce, test_workload_gpt)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from trainscale.strategies import check_strategy

README = (Path(__file__).resolve().parents[2] / "docs" / "tour.md").read_text()  # README points to the tour


def table_specs() -> list[str]:
    table = README[README.index("| `--strategy` | what |") :].split("\n\n")[0]
    return re.findall(r"^\| `([^`]+)` \|", table, re.M)[1:]  # the header's `--strategy` first


def test_the_table_lists_every_strategy_family():
    specs = table_specs()
    assert {s.split(":")[0] for s in specs} == {"ddp", "zero1", "fsdp", "deepspeed"}, specs
    assert len(specs) >= 8


@pytest.mark.parametrize("spec", table_specs())
def test_each_spelling_passes_preflight_for_two_cpu_ranks(spec, tmp_path, monkeypatch):
    if spec.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    monkeypatch.chdir(tmp_path)
    config = re.search(r"cat > ds_config.json <<'EOF'\n(.*?)\nEOF", README, re.S).group(1)
    (tmp_path / "ds_config.json").write_text(config)  # README writes it just before its DeepSpeed line
    check_strategy(spec, 2, batch_size=8, device="cpu")
