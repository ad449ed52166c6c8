"""``hccl_config``: the documented keys and types, how it is configured, and HCCL's own checks in simulation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import xccl_ascend
from xccl_ascend import HCCL_CONFIG_KEYS, set_hccl_config, validate_hccl_config
from xccl_ascend._hccl_config import _CONFIGS, config_for, torch_check
from xccl_ascend._simprofile import SimHcclOptions, check_options

from xccl import InvalidArgument


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    _CONFIGS.clear()
    yield
    _CONFIGS.clear()


def test_documented_keys() -> None:
    ints = {k for k, v in HCCL_CONFIG_KEYS.items() if v.kind != "string"}
    strings = {k for k, v in HCCL_CONFIG_KEYS.items() if v.kind == "string"}
    assert ints == {
        "hccl_buffer_size", "qos_traffic_class", "qos_service_level", "hccl_sdma_qos", "hccl_op_expansion_mode",
        "hccl_world_rank_id", "hccl_job_id", "hccl_exec_timeout",
    }
    assert strings == {"group_name", "hccl_algo", "hccl_retry_enable", "hccl_retry_params", "hccl_buffer_name"}


def test_valid_config_is_copied() -> None:
    cfg = {"hccl_buffer_size": 400, "group_name": "tp0", "hccl_job_id": 2**40, "hccl_exec_timeout": -1}
    out = validate_hccl_config(cfg)
    assert out == cfg and out is not cfg


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hccl_bufer_size": 1}, "unknown key 'hccl_bufer_size' (did you mean 'hccl_buffer_size'?)"),
        ({"group_name": 123}, "group_name (the communicator's name, as get_hccl_comm_name then returns it) must be a str"),
        ({"qos_traffic_class": "123"}, "qos_traffic_class (RDMA traffic class) must be an int, got str '123'"),
        ({"hccl_buffer_size": True}, "must be an int, got bool True"),
        ({"hccl_buffer_size": -1}, "hccl_buffer_size=-1 is outside the uint32 range"),
        ({"hccl_exec_timeout": 2**31}, "outside the int32 range"),
        ({"group_name": "x" * 128}, "group_name must have 1..127 characters, got 128"),
        ([("hccl_buffer_size", 1)], "must be a dict of HCCL options, got list"),
    ],
    ids=["typo", "name-int", "int-str", "bool", "negative", "int32", "long-name", "not-a-dict"],
)
def test_invalid_config(config: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_hccl_config(config)
    assert message in str(err.value)


def test_precedence_and_env() -> None:
    env = {"XCCL_HCCL_CONFIG": '{"hccl_buffer_size": 100}'}
    assert config_for(None, env) == {"hccl_buffer_size": 100}
    set_hccl_config({"hccl_buffer_size": 200})
    set_hccl_config({"hccl_buffer_size": 300, "group_name": "world"}, ranks="world")
    set_hccl_config({"group_name": "tp"}, ranks=[0, 1])
    assert config_for(None, env) == {"hccl_buffer_size": 300, "group_name": "world"}
    assert config_for([0, 1], env) == config_for([1, 0], env) == {"group_name": "tp"}
    assert config_for([2, 3], env) == {"hccl_buffer_size": 200}
    set_hccl_config(None, ranks=[0, 1])
    assert config_for([0, 1], env) == {"hccl_buffer_size": 200}


def test_group_name_cannot_apply_to_every_group() -> None:
    with pytest.raises(InvalidArgument, match="group_name names one communicator"):
        set_hccl_config({"group_name": "x"})
    with pytest.raises(InvalidArgument, match="cannot set group_name"):
        config_for([0], {"XCCL_HCCL_CONFIG": '{"group_name": "x"}'})
    with pytest.raises(InvalidArgument, match=r"is not JSON"):
        config_for([0], {"XCCL_HCCL_CONFIG": "{hccl_buffer_size: 1}"})


def test_simulated_torch_check_messages() -> None:
    """The simulated creator fails like HCCL's TORCH_CHECK, and ignores unknown keys like HCCL."""
    torch_check({"unknown_key": object(), "hccl_buffer_size": 1, "group_name": "g"})
    with pytest.raises(RuntimeError, match=r"^Value type of group_name should be string$"):
        check_options(SimHcclOptions({"group_name": 123}), 0, 2)
    with pytest.raises(RuntimeError, match=r"^Value type of hccl_op_expansion_mode should be int\.$"):
        check_options(SimHcclOptions({"hccl_op_expansion_mode": "123"}), 0, 2)
    check_options(None, 0, 2)
    check_options(object(), 0, 2)  # not Options: HCCL replaces it with fresh Options (logged)


def test_public_reset_is_exported() -> None:
    assert callable(xccl_ascend.reset_mc2_domain)
