"""``hccl_config``: the documented keys and types, how it is configured, and HCCL's own checks in simulation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import xccl_ascend
from xccl_ascend import HCCL_CONFIG_KEYS, set_hccl_config, validate_hccl_config
from xccl_ascend._hccl_config import _CONFIGS, binds_as, config_for, torch_check
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
        ({"group_name": 123}, "group_name (HCCL's hcclUdi, user-defined information; not the communicator's name) must be a str"),
        ({"qos_traffic_class": "123"}, "qos_traffic_class (RDMA traffic class) must be an int, got str '123'"),
        ({"hccl_buffer_size": True}, "must be an int, got bool True"),
        ({"hccl_buffer_size": -1}, "hccl_buffer_size=-1 is outside the uint32 range"),
        ({"hccl_exec_timeout": 2**31}, "outside the int32 range"),
        ({"hccl_job_id": 5}, "hccl_job_id=5: torch_npu reads hccl_job_id as a uint64 only"),
        ({"hccl_job_id": 2**32 - 1}, "Pass a value >= 2**32"),
        ({"hccl_job_id": 2**64}, "outside the uint64 range"),
        ({"hccl_buffer_size": 2**32}, "it would reach torch_npu as uint64"),
        ([("hccl_buffer_size", 1)], "must be a dict of HCCL options, got list"),
    ],
    ids=["typo", "name-int", "int-str", "bool", "negative", "int32", "job-id-small", "job-id-2**32-1", "job-id-big",
         "uint32-big", "not-a-dict"],
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


def test_job_id_as_torch_npu_sees_it() -> None:
    """pybind binds an int below 2**32 as uint32; torch_npu reads hccl_job_id only as uint64."""
    assert validate_hccl_config({"hccl_job_id": 2**32}) == {"hccl_job_id": 2**32}
    assert [binds_as(v) for v in (0, 5, 2**32 - 1, 2**32, 2**63, -1, True, "x", 2**64, 1.0)] == [
        "uint32", "uint32", "uint32", "uint64", "uint64", "int32", "uint32", "string", None, None]
    with pytest.raises(RuntimeError, match=r"^Value type of hccl_job_id should be int\.$"):
        torch_check({"hccl_job_id": 5})
    torch_check({"hccl_job_id": 2**32})
    with pytest.raises(RuntimeError, match=r"^Value type of hccl_buffer_size should be int\.$"):
        torch_check({"hccl_buffer_size": 2**32})  # binds as uint64, read as uint32 only
    with pytest.raises(RuntimeError, match=r"exceeds INT32_MAX\(2147483647\)"):
        torch_check({"hccl_exec_timeout": 2**31})
    with pytest.warns(UserWarning, match="hccl_exec_timeout less than 0"):
        torch_check({"hccl_exec_timeout": -1})  # int32: torch_npu warns once, and takes it
    with pytest.raises(TypeError, match="incompatible function arguments"):
        torch_check({"hccl_buffer_size": 1.5})


def test_group_name_is_the_udi_and_may_apply_to_every_group() -> None:
    """group_name is hcclUdi (not the communicator's name), so one value for every group is fine."""
    set_hccl_config({"group_name": "job-7"})
    assert config_for([0, 1]) == {"group_name": "job-7"}
    assert config_for([0], {"XCCL_HCCL_CONFIG": '{"group_name": "x"}'}) == {"group_name": "job-7"}
    set_hccl_config(None)
    assert config_for([0], {"XCCL_HCCL_CONFIG": '{"group_name": "x"}'}) == {"group_name": "x"}
    with pytest.warns(UserWarning, match="truncates it to 127"):
        assert validate_hccl_config({"group_name": "u" * 128}) == {"group_name": "u" * 128}
    with pytest.warns(UserWarning, match="truncated to 127"):
        torch_check({"group_name": "u" * 128})
    with pytest.warns(UserWarning, match="truncates it to 49"):
        validate_hccl_config({"hccl_retry_enable": "r" * 50})
    with pytest.raises(InvalidArgument, match=r"is not JSON"):
        config_for([0], {"XCCL_HCCL_CONFIG": "{hccl_buffer_size: 1}"})


def test_simulated_torch_check_messages() -> None:
    """The simulated creator fails like HCCL's TORCH_CHECK, and ignores unknown keys like HCCL."""
    torch_check({"unknown_key": object(), "hccl_buffer_size": 1, "group_name": "g"})
    with pytest.raises(RuntimeError, match=r"^Value type of group_name should be string\.$"):
        check_options(SimHcclOptions({"group_name": 123}), 0, 2)
    with pytest.raises(RuntimeError, match=r"^Value type of hccl_op_expansion_mode should be int\.$"):
        check_options(SimHcclOptions({"hccl_op_expansion_mode": "123"}), 0, 2)
    check_options(None, 0, 2)
    check_options(object(), 0, 2)  # not Options: HCCL replaces it with fresh Options (logged)


def test_public_reset_is_exported() -> None:
    assert callable(xccl_ascend.reset_mc2_domain)
