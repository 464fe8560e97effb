"""Bad input to `meshscale train` / `meshscale scale`: one line on stderr, exit code 2, nothing started."""
import pytest
import torch

@pytest.mark.parametrize("argv, message", [
    (["train", "--model", "nope"], "unknown model 'nope'"),
    (["train", "--data", "/no/such/folder"], "data folder /no/such/folder does not exist"),
    (["train", "--mode", "gossip"], "unknown mode 'gossip'"),
    (["scale", "--cpus", "1,3", "--strong", "--global-batch", "16"], "not divisible by 3"),
    (["scale", "--cpus", "1,2", "--weak"], "--weak needs --batch"),
    (["train", "--precision", "fp16", "--mode", "ps-sync"], "use --precision bf16"),
    (["train", "--cuda-graph", "--cpus", "2"], "--cuda-graph needs GPUs"),
    (["train", "--ps-servers", "1", "--cpus", "2"], "needs --mode ps-sync or ps-async"),
    (["train", "--mode", "ps-sync", "--ps-servers", "2", "--cpus", "2"], "at least one worker left"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, cli):
    run = cli(*argv)
    code, err = run.exit_code, run.stderr.strip()
    assert code == 2
    assert err.startswith("meshscale: error: ") and message in err and "\n" not in err


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine has 8 GPUs")
def test_more_gpus_than_the_machine_has(cli):
    run = cli("scale", "--gpus", "1,8", "--weak", "--batch", "4")
    code, err = run.exit_code, run.stderr.strip()
    assert code == 2 and "asked for 8 GPUs" in err and "\n" not in err
