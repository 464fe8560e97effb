"""One question, one answer: every option `predict` declares either changes its answer or is refused in one line
(exit 2), never silently ignored; and the same size gets the same figure whichever way it is asked."""
import json
from pathlib import Path

import pytest

from meshscale.options import option_fields
from meshscale.predict import PredictRequest, predict_rows, predict_training

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BASES = {
    "resnet": ("--model", "resnet50", "--system", "hgx-h100", "--gpus", "8", "--batch", "64"),
    "llama": ("--model", "llama-1b", "--system", "hgx-h100", "--gpus", "8", "--precision", "bf16"),
}
# values for every declared option (the test fails when an option is added without one here); the first that
# changes the answer, or is refused, passes (a value can be what the model picks anyway: NCCL's own algorithm)
VALUES = {
    "model": ["gpt-small"], "system": ["dgx1-v100"], "gpus": ["4"], "nodes": ["2"], "gpu": ["NVIDIA H200"],
    "link": ["hdr"], "nics": ["4"], "gpudirect": [], "network": ["rail"], "oversubscription": ["4"], "placement": ["packed"],
    "batch": ["32"], "global_batch": ["128"], "seq_len": ["512"], "precision": ["fp16", "fp32"],
    "checkpointing": ["full"], "channels_last": [], "cuda_graph": [], "attention": ["flash"], "dp": ["2"],
    "fsdp": ["4"], "tp": ["2"], "pp": ["2"], "cp": ["2"], "pp_schedule": ["gpipe"], "micro_batches": ["2"],
    "search": [], "profile": [str(FIXTURES / "profiles/h100/profile-resnet50.json")],
    "p2p": [str(FIXTURES / "p2p_h200x2.json")], "bench": [str(FIXTURES / "bench_allreduce_h200x2.json")],
    "nccl_env": ["NCCL_MAX_NCHANNELS=1"], "nccl_algo": ["ring", "tree", "nvls"], "mode": ["ps-sync"], "framework": ["compile", "cntk-2016"],
    "wire": ["bf16"], "compare": ["frameworks"], "measured": [str(FIXTURES / "report/scale.json")],
    "partition": ["3g.40gb"], "ep": ["2"], "moe_imbalance": ["1.5"], "fp8_recipe": ["rowwise"],
    "cp_attention": ["allgather"],
}
FLAGS = {f.path[0]: f.flags[0] for f in option_fields(PredictRequest)}


def test_every_declared_option_has_a_value_here():
    assert set(FLAGS) == set(VALUES)


def _answer(cli, tmp_path, args) -> tuple[int, str, str]:
    out = tmp_path / "answer.json"
    out.unlink(missing_ok=True)
    done = cli("predict", *args, "--json", out)
    return done.exit_code, done.stderr, out.read_text() if out.exists() else ""


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("name", sorted(VALUES))
def test_an_option_changes_the_answer_or_is_refused_in_one_line(cli, tmp_path, base, name):
    code, _, plain = _answer(cli, tmp_path, BASES[base])
    assert code == 0
    flag = FLAGS[name].split("/")[-1] if name == "gpudirect" else FLAGS[name].split("/")[0]
    rows = lambda text: [{k: v for k, v in r.items() if isinstance(v, (int, float))}  # noqa: E731
                         for r in json.loads(text)["rows"]]
    for value in VALUES[name] or [None]:
        args = list(BASES[base])
        if flag in args:   # the base's own option: another value
            args[args.index(flag) + 1] = value
        else:
            args += [flag] + ([value] if value is not None else [])
        code, stderr, given = _answer(cli, tmp_path, args)
        if code == 2:
            assert stderr.count("\n") == 1 and stderr.startswith("meshscale: error:"), stderr
            return
        assert code == 0, stderr
        if rows(given) != rows(plain):
            return
    pytest.fail(f"{flag} accepted and ignored")


def test_the_sweep_and_the_layout_give_a_size_the_same_figure():
    sweep, _, _ = predict_rows(PredictRequest(model="resnet50", system="hgx-h100", gpus=(1, 8), batch=64))
    (layout,), _ = predict_training(PredictRequest(model="resnet50", system="hgx-h100", gpus=(8,), dp=8, batch=64))
    assert sweep[-1]["throughput_samples_per_s"] == layout.samples_per_s
    (typed,), _ = predict_training(PredictRequest(model="resnet50", system="hgx-h100", gpus=(8,), batch=64,
                                                  precision="fp32"))
    assert typed.samples_per_s == layout.samples_per_s  # train's default, typed or not


@pytest.mark.slow  # every corpus run priced twice
def test_every_training_corpus_run_is_priced_by_predict_as_validate_prices_it():
    from meshscale.predict.answer import answer
    from meshscale.predict.training.validate import load_training_corpus, validate_training

    by_row = {r["row"]: r for r in validate_training().rows}
    for run in load_training_corpus():
        found = answer(run.request)
        p = found.predictions[0]
        figure = p.tokens_per_s_per_gpu if run.metric == "tokens_per_s_per_gpu" else p.samples_per_s
        assert figure == by_row[run.row]["predicted"], run.row


def test_the_names_help_lists_are_the_models_and_presets_train_and_predict_know():
    from meshscale.models.registry import MODELS
    from meshscale.models.transformer import preset_names
    from meshscale.options import MODEL_NAMES, PRESET_NAMES
    assert MODEL_NAMES == tuple(MODELS) and PRESET_NAMES == tuple(preset_names())


def test_predict_help_names_the_models(cli, monkeypatch):
    from meshscale.options import MODEL_NAMES, PRESET_NAMES
    monkeypatch.setenv("COLUMNS", "80")
    run = cli("predict", "-h")
    assert run.exit_code == 0, run.output
    words = {word.strip(",()") for word in run.stdout.replace("│", " ").split()}
    assert {"llama3-8b", "resnet50"} <= words and set(MODEL_NAMES + PRESET_NAMES) <= words


@pytest.mark.parametrize("more", [(), ("--search",), ("--search", "--fsdp", "8")])
def test_a_mistyped_model_is_named_unknown_with_the_close_name_in_one_line(cli, more):
    run = cli("predict", "--model", "llama3-8bb", "--system", "hgx-h100", "--gpus", "8", *more)
    assert run.exit_code == 2
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "unknown model 'llama3-8bb' (did you mean llama3-8b?)" in run.stderr
