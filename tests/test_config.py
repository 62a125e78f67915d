"""Config variants and --set overrides."""
import pytest

from flaxport.cli.common import apply_overrides, config_from_dict
from flaxport.errors import UserError
from flaxport.workloads import registry

GAN = registry.get("gan")


def test_default_is_the_reference():
    c = GAN.get_config("default")
    # nn.BatchNorm1d(64, 0.8): eps 0.8 with torch momentum 0.1; Adam 5e-5 / 1e-4; batch 10.
    assert (c.bn_eps, c.bn_momentum, c.g_lr, c.d_lr, c.batch_size, c.z_dim) == (0.8, 0.1, 5e-5, 1e-4, 10, 512)
    assert c.g_widths == (64, 32) and c.d_widths == (32, 64)


def test_overrides_parse_as_the_field_type():
    c = apply_overrides(GAN.get_config("default"), ["g_lr=2e-4", "batch_size=64", "g_widths=128,64", "d_batchnorm=false"])
    assert c.g_lr == 2e-4 and c.batch_size == 64 and c.g_widths == (128, 64) and c.d_batchnorm is False


@pytest.mark.parametrize("item,msg", [("nope=1", "no field"), ("batch_size=ten", "as int"), ("g_lr", "KEY=VALUE"),
                                      ("d_batchnorm=maybe", "as bool")])
def test_bad_overrides_are_user_errors(item, msg):
    with pytest.raises(UserError, match=msg):
        apply_overrides(GAN.get_config("default"), [item])


def test_config_round_trips_through_config_json():
    import dataclasses
    import json

    c = apply_overrides(GAN.get_config("smoke"), ["g_widths=16,8"])
    saved = json.loads(json.dumps(dataclasses.asdict(c)))
    assert config_from_dict(GAN, saved) == c


def test_every_variant_builds():
    for v in GAN.variants:
        assert GAN.get_config(v).variant == v
