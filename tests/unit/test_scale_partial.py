"""A scaling sweep whose later world size fails keeps the finished ones: shown, saved (meta.failed), then one
error line."""
import json

from meshscale.errors import WorkerError
from meshscale.train import scale as scale_module


def _fake_summary(cfg, outputs):
    return {"world_size": cfg.world, "mode": cfg.mode, "batch_per_rank": cfg.batch_per_rank,
            "global_batch": cfg.global_batch, "step_time_s": 0.1, "compute_s": 0.08, "comm_s": 0.01, "data_s": 0.01,
            "comm_share": 0.1, "samples_per_s": 20.0 * cfg.world}


def test_a_failing_later_world_size_keeps_the_finished_rows(cli, tmp_path, monkeypatch):
    ran = []

    def fake_run(cfg):
        ran.append(cfg.world)
        if cfg.world == 4:
            raise WorkerError("rank 3 died (signal 9) during training step 2 (ddp)")
        return [{}]

    monkeypatch.setattr(scale_module, "run", fake_run)
    monkeypatch.setattr(scale_module, "summarize", _fake_summary)
    out = tmp_path / "scale.json"
    result = cli("scale", "--weak", "--batch", "2", "--cpus", "1,2,4", "--steps", "3", "--timing-warmup", "1",
                 "--json", out)
    assert result.exit_code == 2 and ran == [1, 2, 4]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "4-worker run failed" in lines[0] and "rank 3 died" in lines[0]
    saved = json.loads(out.read_text())
    assert [r["world_size"] for r in saved["rows"]] == [1, 2] and "4 workers" in saved["meta"]["failed"]
    assert "2 workers" in result.stdout or "2 " in result.stdout


def test_a_first_world_size_failing_is_the_plain_error(cli, tmp_path, monkeypatch):
    def fake_run(cfg):
        raise WorkerError("rank 0 failed with boom during start-up")

    monkeypatch.setattr(scale_module, "run", fake_run)
    out = tmp_path / "scale.json"
    result = cli("scale", "--weak", "--batch", "2", "--cpus", "1,2", "--steps", "3", "--timing-warmup", "1",
                 "--json", out)
    assert result.exit_code == 2 and "boom" in result.stderr and not out.exists()
