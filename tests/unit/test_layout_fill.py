"""The degree not given takes what the others leave, the same way in train and predict (`filled_degrees`)."""
import random

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.layout import filled_degrees


def test_what_the_given_degrees_leave_goes_to_fsdp_else_to_dp():
    rng = random.Random(0)
    for _ in range(300):
        given = {k: rng.choice((2, 4)) for k in ("dp", "fsdp", "tp", "pp", "cp") if rng.random() < 0.4}
        product = 1
        for v in given.values():
            product *= v
        world = product * rng.choice((1, 2, 4, 8))
        found = filled_degrees(given, world, "fsdp")
        assert {k: found[k] for k in given} == given or found == given       # a given degree never changes
        total = 1
        for v in found.values():
            total *= v
        taker = "fsdp" if "fsdp" not in given else ("dp" if "dp" not in given else None)
        assert total == (world if taker or product == world else product)
        assert set(found) - set(given) <= ({taker} if taker and world > product else set())


def test_degrees_that_do_not_divide_the_ranks_are_one_line():
    with pytest.raises(MeshscaleError, match="does not divide the 6 ranks"):
        filled_degrees({"tp": 4}, 6, "fsdp")


def test_train_fills_the_layout_as_predict_does():
    from meshscale.train.config import LayoutOptions, TrainConfig
    from meshscale.train.parallel.plan import with_default_layout

    for layout, want in ((dict(ep=2, fsdp=2), dict(dp=2, fsdp=2)), (dict(ep=2, tp=2), dict(tp=2, fsdp=2)),
                         (dict(), dict(fsdp=4)), (dict(fsdp=2, tp=2), dict(fsdp=2, tp=2))):
        cfg = with_default_layout(TrainConfig(model="moe-tiny", world=4, layout=LayoutOptions(**layout)))
        assert {k: v for k in ("dp", "fsdp", "tp", "pp", "cp") if (v := getattr(cfg.layout, k)) > 1} == want
