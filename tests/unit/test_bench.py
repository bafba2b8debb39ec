"""trainscale bench: configuration tokens, batches, busbw, projection model, results and plots (no launches)."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from trainscale.bench import allreduce, configs, projection, results
from trainscale.bench.study import StudySpec, choose_out_dir, plan
from trainscale.errors import ConfigError

# --- configuration tokens -------------------------------------------------------------------------


def test_tokens_on_a_machine_without_gpus():
    parsed = configs.parse_configs("cpu,1,2,4", gpus_visible=0)
    assert [(c.token, c.world_size, c.device, c.gpus) for c in parsed] == [
        ("cpu", 1, "cpu", False), ("1", 1, "auto", False), ("2", 2, "auto", False), ("4", 4, "auto", False)]
    assert [c.label for c in parsed] == ["CPU", "Single CPU rank", "DDP 2 CPU ranks", "DDP 4 CPU ranks"]


def test_tokens_with_gpus_and_nodes():
    one, four = configs.parse_configs("1,4", gpus_visible=4)
    assert (one.label, four.label, four.gpus) == ("Single GPU", "DDP 4 GPUs", True)
    two_by_four, two_nodes = configs.parse_configs("2x4,2n", gpus_visible=4, slurm=True, ranks_per_node=8)
    assert (two_by_four.nnodes, two_by_four.nproc_per_node, two_by_four.world_size) == (2, 4, 8)
    assert (two_nodes.nnodes, two_nodes.nproc_per_node) == (2, 8)
    assert two_by_four.label == "DDP 2 nodes x 4 GPUs"


@pytest.mark.parametrize("text, expected", [
    ("1,gpu8", "unknown configuration token 'gpu8'"),
    ("0", "configuration '0': 0 ranks"),
    ("1,-2", "configuration '-2': -2 ranks"),
    ("0x2", "configuration '0x2': 0 nodes"),
    ("1,,2", "has an empty entry"),
    ("1,2,1", "appears twice"),
    ("2x2", "spans 2 nodes, which needs --slurm"),
    ("2n", "counts nodes, which needs --slurm"),
])
def test_bad_tokens_name_the_problem(text, expected):
    with pytest.raises(ConfigError) as info:
        configs.parse_configs(text, gpus_visible=0)
    assert expected in str(info.value)
    assert "Hint:" in str(info.value)


def test_more_gpu_ranks_than_gpus_is_refused():
    with pytest.raises(ConfigError, match="asks for 8 GPU ranks but 4 GPU"):
        configs.parse_configs("8", gpus_visible=4)


def test_baseline_must_be_in_the_study():
    parsed = configs.parse_configs("1,2", gpus_visible=0)
    assert configs.find_baseline(parsed, None).token == "1"
    assert configs.find_baseline(parsed, "2").token == "2"
    with pytest.raises(ConfigError, match="--baseline '4' is not one of") as info:
        configs.find_baseline(parsed, "4")
    assert "1, 2" in str(info.value)


def test_strong_scaling_splits_the_global_batch_and_weak_keeps_it():
    one, two, four = configs.parse_configs("1,2,4", gpus_visible=0)
    assert [configs.per_rank_batch(c, 64, "strong") for c in (one, two, four)] == [64, 32, 16]
    assert [configs.per_rank_batch(c, 64, "weak") for c in (one, two, four)] == [64, 64, 64]
    with pytest.raises(ConfigError, match="global batch 30 fixed.*4 ranks and 30 is not divisible by 4"):
        configs.per_rank_batch(four, 30, "strong")
    with pytest.raises(ConfigError, match="--scaling 'linear' unknown"):
        configs.per_rank_batch(one, 8, "linear")


def test_weak_scaling_max_steps_keep_the_work_equal():
    one, two, four = configs.parse_configs("1,2,4", gpus_visible=0)
    assert [configs.scaled_max_steps(40, c, one, "weak") for c in (one, two, four)] == [40, 20, 10]
    assert configs.scaled_max_steps(10, four, one, "weak") == 3  # rounded up
    assert configs.scaled_max_steps(10, four, one, "strong") == 10
    assert configs.scaled_max_steps(None, four, one, "weak") is None


def test_plan_checks_everything_before_launching(tmp_path):
    spec = StudySpec(workload="cnn", configs="1,2,4", scaling="strong", batch_size=30, out_dir=tmp_path / "s")
    with pytest.raises(ConfigError, match="not divisible by 4"):
        plan(spec)
    with pytest.raises(ConfigError, match="unknown workload 'cnm'"):
        plan(StudySpec(workload="cnm", configs="1"))
    with pytest.raises(ConfigError, match="--baseline 'cpu' is not one of"):
        plan(StudySpec(workload="cnn", configs="1,2", baseline="cpu"))
    # the workload's own preflight: 1438 digits cannot give 4 ranks x 512 samples a step
    with pytest.raises(ConfigError, match="configuration '4'"):
        plan(StudySpec(workload="cnn", configs="1,4", batch_size=512))
    assert not (tmp_path / "s").exists()


def test_plan_arguments_per_run():
    p = plan(StudySpec(workload="cnn", configs="cpu,2", scaling="strong", batch_size=32, max_steps=5, epochs=1,
                       data="synthetic", samples=512, workload_args=("--lr", "0.01")))
    cpu, two = p.runs
    assert (cpu.name, cpu.per_rank_batch, cpu.global_batch) == ("01-cpu", 32, 32)
    assert (two.name, two.per_rank_batch, two.global_batch) == ("02-2", 16, 32)
    assert "--device" in cpu.args and "--device" not in two.args
    assert two.args[-2:] == ("--lr", "0.01") and "--breakdown" in two.args
    sweep = plan(StudySpec(workload="cnn", configs="1", sweep_batches=(16, 64), epochs=1))
    assert [(r.name, r.per_rank_batch) for r in sweep.runs] == [("01-1-b16", 16), ("02-1-b64", 64)]


def test_script_args_get_the_per_rank_batch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    p = plan(StudySpec(script=str(script), script_args=("--bs", "{batch}"), configs="1,2", scaling="strong",
                       batch_size=8))
    assert [r.args for r in p.runs] == [("--bs", "8"), ("--bs", "4")]


def test_an_existing_study_is_never_overwritten(tmp_path):
    taken = tmp_path / "study"
    taken.mkdir()
    (taken / "results.json").write_text("{}")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        choose_out_dir(taken)
    import datetime

    now = datetime.datetime(2025, 1, 2, 3, 4, 5)
    (tmp_path / "20250102-030405").mkdir()
    assert choose_out_dir(None, root=tmp_path, now=now) == tmp_path / "20250102-030405-2"


# --- all-reduce bandwidth -------------------------------------------------------------------------


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    size, seconds = 8 * 1024 * 1024, 0.004
    for n, factor in ((1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)):
        algbw, busbw = allreduce.bandwidths(size, seconds, n)
        assert algbw == pytest.approx(2097152000.0)
        assert busbw == pytest.approx(2097152000.0 * factor)
    with pytest.raises(ConfigError):
        allreduce.bandwidths(size, 0.0, 2)


def test_sizes():
    assert allreduce.parse_sizes("1KB..8KB") == (1024, 2048, 4096, 8192)
    assert allreduce.parse_sizes("4KB,1MB,4800B") == (4096, 1048576, 4800)
    assert allreduce.parse_size("256MB") == 256 * 1024 * 1024
    assert allreduce.format_size(16 * 1024 * 1024) == "16MB"
    for bad in ("1XB", "3B", "16MB..1KB", "fast"):
        with pytest.raises(ConfigError):
            allreduce.parse_sizes(bad)


# --- projection model -----------------------------------------------------------------------------


def test_ring_allreduce_time_by_hand():
    # 100 MB over 4 ranks at 10 GB/s busbw: 2*3/4 * 1e8 / 1e10 = 0.015 s; latency 2*3 steps * 2 buckets * 5 us
    assert projection.ring_allreduce_s(1e8, 4, 1e10, 5e-6, buckets=2) == pytest.approx(0.015 + 6e-5)
    assert projection.ring_allreduce_s(1e8, 1, 1e10, 5e-6) == 0.0
    assert projection.bucket_count(4_799_528) == 1
    assert projection.bucket_count(60 * projection.MiB) == 3


def test_predict_weak_scaling_by_hand():
    m = projection.Measured(data_s=0.001, compute_s=0.090, optimizer_s=0.009, batch=32, gradient_bytes=int(1e8))
    net = projection.Network(name="test", busbw_Bps=1e10, latency_s=0.0)
    p = projection.predict(m, net, 8, projection.ModelOptions(scaling="weak", overlap=1.0, buckets=4))
    comm = 2 * 7 / 8 * 1e8 / 1e10  # 0.0175
    hidden = 2 / 3 * 0.090 * 3 / 4  # 0.045: all but the last bucket can hide behind backward
    assert p.comm_s == pytest.approx(comm)
    assert p.exposed_comm_s == pytest.approx(max(0.0, comm - hidden)) == 0.0
    assert p.step_s == pytest.approx(0.1)
    assert p.samples_per_s == pytest.approx(8 * 32 / 0.1)
    one_bucket = projection.predict(m, net, 8, projection.ModelOptions(scaling="weak", buckets=1))
    assert one_bucket.exposed_comm_s == pytest.approx(comm)  # a single bucket cannot overlap at all
    assert one_bucket.step_s == pytest.approx(0.1 + comm)


def test_predict_strong_scaling_and_shared_cores_by_hand():
    m = projection.Measured(data_s=0.002, compute_s=0.080, optimizer_s=0.010, other_s=0.008, batch=64,
                            gradient_bytes=4_000_000)
    net = projection.Network(name="test", busbw_Bps=1e9, latency_s=1e-4)
    p = projection.predict(m, net, 4, projection.ModelOptions(scaling="strong", overlap=0.5))
    comm = 1.5 * 4e6 / 1e9 + 1 * 6 * 1e-4  # 0.0066
    assert (p.per_rank_batch, p.global_batch) == (16, 64)
    assert p.compute_s == pytest.approx(0.020) and p.data_s == pytest.approx(0.0005)
    assert p.exposed_comm_s == pytest.approx(comm)
    assert p.step_s == pytest.approx(0.0005 + 0.020 + 0.010 + 0.008 + comm)
    shared = projection.predict(m, net, 4, projection.ModelOptions(scaling="strong", overlap=0.5,
                                                                    shared_compute=True))
    # the four ranks take turns on the same cores: a quarter of the batch each, four times over
    assert shared.compute_s == pytest.approx(0.080) and shared.optimizer_s == pytest.approx(0.040)


def test_presets_and_ranks():
    hdr = projection.get_preset("ib-hdr200")
    assert hdr.busbw_Bps == pytest.approx(200e9 / 8 * 0.92)
    assert projection.get_preset("ib-hdr200", links_per_node=8).busbw_Bps == pytest.approx(8 * hdr.busbw_Bps)
    lumi = projection.get_preset("slingshot-11")
    assert lumi.busbw_Bps == pytest.approx(4 * 25e9 * 0.8)
    with pytest.raises(ConfigError, match="did you mean 'ib-hdr200'"):
        projection.get_preset("ib-hdr20")
    assert projection.projection_ranks(8, 1024) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert projection.projection_ranks(8, 100) == [8, 16, 32, 64, 100]
    m = projection.Measured(data_s=0, compute_s=0.1, optimizer_s=0, batch=8, gradient_bytes=1000)
    nv = projection.get_preset("nvlink-a100").network()
    assert [p.ranks for p in projection.project(m, nv, [8, 16, 32])] == [8]


# --- results -------------------------------------------------------------------------------------


def _metrics(times, steps, batch, comm=0.0):
    return {"num_nodes": 1, "device": "cpu", "epochs": [
        {"epoch": i + 1, "steps": steps, "time_s": t, "samples_per_s": steps * batch / t, "train_loss": 0.5,
         "test_loss": 0.4, "accuracy": 0.9,
         "breakdown": {"data": 0.01 * t, "compute": 0.7 * t, "communication": comm * t, "optimizer": 0.1 * t,
                       "communication_total": comm * t, "gradient_bytes": 4000, "buckets": 1}}
        for i, t in enumerate(times)]}


def _study():
    runs = []
    for token, ws, times, batch in (("1", 1, [4.0, 4.0], 32), ("2", 2, [2.5, 2.5], 64), ("4", 4, [2.0, 2.0], 128)):
        rec = {"name": f"run-{token}", "config": token, "label": f"{ws} ranks", "world_size": ws, "nodes": 1,
               "per_rank_batch": 32, "global_batch": batch, "status": "ok", "device": "cpu", "load_before": 0.1}
        rec.update(results.record_from_metrics(_metrics(times, 100 // ws, batch, comm=0.1 if ws > 1 else 0.0),
                                               global_batch=batch))
        runs.append(rec)
    results.add_speedups(runs, "1")
    return {"target": "workload cnn", "baseline": "1", "runs": runs, "spec": {"scaling": "weak"},
            "environment": {"device": "CPU", "cores": 2, "host": "h", "torch": "x", "trainscale": "y"}}


def test_speedup_and_efficiency_are_consistent():
    study = _study()
    base, two, four = study["runs"]
    assert (base["runtime_s"], base["samples"]) == (8.0, 2 * 100 * 32)
    assert two["speedup"] == pytest.approx(base["runtime_s"] / two["runtime_s"])  # same samples: plain ratio
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    # 4 ranks x 25 steps x 32 = 3200 samples per epoch, the same work again
    assert four["speedup"] == pytest.approx(2.0) and four["efficiency"] == pytest.approx(0.5)
    b = two["breakdown"]
    assert b["communication_fraction"] == pytest.approx(0.1)  # of the whole step, "other" included
    assert b["data"] + b["compute"] + b["communication"] + b["optimizer"] + b["other"] == pytest.approx(
        two["step_time_s"])


def test_unequal_work_is_compared_per_sample():
    base = {"runtime_s": 10.0, "samples": 1000}
    run = {"runtime_s": 6.0, "samples": 990}
    assert results.speedup(base, run) == pytest.approx((10 / 1000) / (6 / 990))


def test_table_csv_and_document():
    study = _study()
    table = results.markdown_table(study)
    assert table.splitlines()[0] == ("| Version | Workers | Runtime (s) | Speedup | Parallel efficiency | Samples/s "
                                     "| Comm. share |")
    assert "| 2 ranks | 2 | 5.0 | 1.60x | 80% |" in table
    rows = list(csv.DictReader(io.StringIO(results.csv_text(study))))
    assert [r["config"] for r in rows] == ["1", "2", "4"]
    assert float(rows[2]["speedup"]) == pytest.approx(2.0)
    study["runs"][1]["load_before"] = 5.0
    doc = results.markdown_document(study, {"speedup": "/x/speedup.png"})
    assert "![speedup](speedup.png)" in doc and "machine was busy" in doc


def test_failed_runs_and_missing_baseline_have_no_speedup():
    study = _study()
    study["runs"][0]["status"] = "failed"
    results.add_speedups(study["runs"], "1")
    assert all(r["speedup"] is None for r in study["runs"])
    assert "| 1 ranks | 1 | failed |" in results.markdown_table(study)


def test_plots_are_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from trainscale.bench import plots

    study = _study()
    m = projection.Measured(data_s=0.0, compute_s=0.04, optimizer_s=0.004, batch=32, gradient_bytes=4000)
    preds = projection.project(m, projection.get_preset("ib-hdr200").network(), [8, 16])
    study["projection"] = {"network": {"name": "ib-hdr200"}, "rows": [
        {**p.as_dict(), "speedup": p.ranks * 0.9, "label": f"{p.ranks} ranks"} for p in preds]}
    made = plots.make_all(study, tmp_path)
    assert set(made) == {"speedup", "throughput", "breakdown"}
    for path in made.values():
        with open(path, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_allreduce_table_and_measured_network():
    from trainscale.bench.predictions import allreduce_sizes, network_from_allreduce

    rows = []
    for size, seconds in ((4096, 1e-4), (4_000_000, 4e-3)):
        algbw, busbw = allreduce.bandwidths(size, seconds, 4)
        rows.append({"bytes": size, "count": size // 4, "iters": 5, "time_s": seconds, "algbw_Bps": algbw,
                     "busbw_Bps": busbw})
    result = {"world_size": 4, "backend": "gloo", "device": "cpu", "rows": rows}
    assert "busbw (GB/s)" in allreduce.table(result)
    net = network_from_allreduce(result, 4_000_000)
    assert net.busbw_Bps == pytest.approx(1.5e9)
    # the 4 KB message: 1e-4 s = 1.5 * 4096 / 1.5e9 + 6 * latency
    assert net.latency_s == pytest.approx((1e-4 - 4096 / 1e9) / 6)
    assert allreduce_sizes(4_799_530) == "4KB,4799528B"


def test_union_of_intervals():
    from trainscale.workloads.timing import _union_length

    assert _union_length([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert _union_length([]) == 0.0


def test_epoch_recorder_writes_the_workload_format(tmp_path):
    from trainscale.bench.metrics import EpochRecorder

    class FakeRuntime:
        is_main, world_size, num_nodes, device = True, 1, 1, "cpu"

        def mean(self, x):
            return float(x)

    rec = EpochRecorder(FakeRuntime(), path=tmp_path / "m.json")
    rec.start()
    rec.end(steps=3, samples=96, train_loss=0.2)
    data = json.loads(rec.write().read_text())
    assert data["epochs"][0]["steps"] == 3 and data["epochs"][0]["samples"] == 96
    assert math.isfinite(data["train_time_s"])
    assert EpochRecorder(FakeRuntime(), path=None).write() is None  # outside bench: nothing happens


def test_projection_requests_are_checked_before_launching(tmp_path):
    from trainscale.bench import ProjectionRequest, run_study

    out = tmp_path / "never"
    with pytest.raises(ConfigError, match="unknown interconnect 'infiniband'"):
        ProjectionRequest(project_to=64, interconnect="infiniband")
    with pytest.raises(ConfigError, match="--project-to 1 must be >= 2"):
        ProjectionRequest(project_to=1, interconnect="ib-hdr200")
    with pytest.raises(ConfigError, match="has none"):
        run_study(StudySpec(workload="cnn", configs="2", out_dir=out),
                  projection=ProjectionRequest(project_to=64, interconnect="ib-hdr200"))
    with pytest.raises(ConfigError, match="--interconnect measured"):
        run_study(StudySpec(workload="cnn", configs="1", out_dir=out), projection=ProjectionRequest(project_to=64))
    assert not out.exists()
