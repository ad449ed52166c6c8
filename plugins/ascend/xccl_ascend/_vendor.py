"""What torch_npu and HCCL do at run time, as xccl's :class:`~xccl.plugin.VendorRuntime` data, with sources.

Read in torch_npu at tag ``compatibility_release-pytorch2.13.0`` (462f4e1; the same code, a few lines
apart, at 94c0533 and 46936d1) and in CANN's documentation. xccl acts on this on the hardware (the watchdog's timeout and mode, the world
connected at ``xccl.init``, ``xccl doctor``) and the simulation reproduces it (``xccl.plugin._sim_runtime``).
Cheap: no torch_npu import, like the capability table.
"""

from __future__ import annotations

import functools
from typing import Final

from xccl.plugin import (
    CommMemory,
    Completion,
    ErrorHandling,
    Fault,
    LazyConnect,
    TorchPatch,
    VendorFault,
    VendorRuntime,
    Watchdog,
)

from ._releases import Release, release

__all__ = ["CANN_BUFFSIZE_ENV", "CANN_CONNECT_ENV", "CANN_EI0002", "CANN_EI0006", "EI0002", "EI0006", "ascend_runtime"]

_PT: Final = "Ascend/pytorch@462f4e1 torch_npu/"
_PGH: Final = _PT + "csrc/distributed/ProcessGroupHCCL.cpp"
_OPTS: Final = _PT + "csrc/core/npu/register/OptionsManager.cpp"
_C10D: Final = _PT + "distributed/distributed_c10d.py"
_PATCHES: Final = _PT + "_init/patches/distributed_patches.py"
_CANN: Final = "https://www.hiascend.com/document/detail/"
#: CANN's page for EI0002 (communication operation timeout).
CANN_EI0002: Final = (f"{_CANN}zh/canncommercial/80RC3/developmentguide/maintenref/troubleshooting/"
                      "atlaserrorcode_15_0242.html")
#: CANN's HCCL guide page for EI0006 (link establishment timeout, HCCL_CONNECT_TIMEOUT).
CANN_EI0006: Final = f"{_CANN}zh/CANNCommunityEdition/850alpha002/hccl/hcclug/hcclug_000050.html"
_CANN_EXEC_ENV: Final = f"{_CANN}en/canncommercial/850/commlib/hcclug/hcclug_000074.html"
#: CANN's HCCL_CONNECT_TIMEOUT page: an integer in [120, 7200], default 120 (the real wait is 20 s longer).
CANN_CONNECT_ENV: Final = f"{_CANN}zh/canncommercial/850/maintenref/envvar/envref_07_0149.html"
#: CANN's HCCL_BUFFSIZE page: each communicator takes 2 x HCCL_BUFFSIZE, one buffer to send and one to receive;
#: a communicator's own hcclBufferSize takes precedence.
CANN_BUFFSIZE_ENV: Final = f"{_CANN}en/CANNCommunityEdition/900/maintenref/envvar/envref_07_0080.html"

#: HCCL's message when a collective does not complete within HCCL_EXEC_TIMEOUT (CANN's EI0002 text; ``{exec_s}``
#: is the timeout).
EI0002: Final = (
    "EI0002: The wait execution of the Notify register times out. Reason: The Notify register has not received the "
    "Notify record from remote rank: [unknown]. Possible Cause: 1. An exception occurs during the execution on "
    "some NPUs in the cluster. As a result, collective communication operation failed. 2. The execution speed on "
    "some NPU in the cluster is too slow to complete a communication operation within the timeout interval. "
    "(default 1800s, You can set the interval by using HCCL_EXEC_TIMEOUT.) 3. The number of training samples of "
    "each NPU is inconsistent. 4. Packet loss or other connectivity problems occur on the communication link. "
    "[timeout {exec_s:g}s]"
)
#: HCCL's message when a communicator cannot connect within HCCL_CONNECT_TIMEOUT (``{timeout_s}``).
EI0006: Final = (
    "EI0006: Getting socket times out. Reason: 1. The remote does not initiate a connect request. some NPUs in the "
    "cluster are abnormal. 2. The remote does not initiate a connect request because the collective "
    "communication operator is started too late or is not started by some NPU in the cluster. 3. The "
    "communication link is disconnected. [wait socket establish timeout, timeout[{timeout_s:g} s]]"
)

#: torch_npu's warning at group creation (ProcessGroupHCCL.cpp:1235-1236).
_WARNING: Final = (
    "The watchdog timeout {timeout_ms}ms(which is set by init_process_group) is less than or equal to HCCL execution "
    "timeout {exec_ms}ms! The plog may not be recorded."
)


def ascend_runtime(npu: Release | None = None) -> VendorRuntime:
    """torch_npu's and HCCL's run-time behaviour: 2.13's, with what the release ``npu`` does otherwise (default: the
    release in force, ``_releases.release``)."""
    return _runtime(npu or release())


@functools.cache
def _runtime(npu: Release) -> VendorRuntime:
    return VendorRuntime(
        completion=Completion.STREAM,
        completion_source=f"{_PGH}:996-1007 (WorkHCCL::synchronizeInternal blocks the current stream; "
        "npuSynchronizeDevice for barrier work only), :1084-1094 (wait never rethrows the watchdog's exception)",
        teardown_syncs=(f"{_PGH}:1386-1457 (shutdown synchronises every HCCL stream of the group first, :1404-1413), "
                        f"{_PT}csrc/core/npu/NPUStream.cpp:494-502 (aclrtSynchronizeStreamWithTimeout)"),
        watchdog=Watchdog(
            mode_env=npu.mode_env,
            mode_env_aliases=npu.mode_aliases,
            modes=frozenset(map(ErrorHandling, npu.modes)),
            default_mode=ErrorHandling.TEAR_DOWN,
            exec_timeout_env="HCCL_EXEC_TIMEOUT",
            exec_timeout_default=1836.0,
            default_margin=1800.0,
            warning=_WARNING,
            exec_error=EI0002,
            source=(f"{_OPTS}:242-265 (CheckUseHcclAsyncErrorHandleEnable: default 1, read once per process), "
                    f"{_OPTS}:189-203 (GetHCCLExecTimeout), {_PGH}:74 (defaultExecTimeout 1836), "
                    f"{_PGH}:1231-1251 (TearDown only: the warning, and torch's 30-min default replaced by "
                    f"HCCL_EXEC_TIMEOUT+1800 s), {_PGH}:965-981 and :2246-2252 (handleException rethrows on the "
                    f"watchdog thread: 'we are taking the entire process down'), {_PGH}:866-893 (checkTimeout), "
                    f"{_PT}csrc/distributed/ProcessGroupHCCL.hpp:226-246 (modes), {CANN_EI0002}, {_CANN_EXEC_ENV}"),
        ),
        lazy_connect=LazyConnect(
            timeout_env="HCCL_CONNECT_TIMEOUT",
            timeout_default=120.0,
            error=EI0006,
            minimum=120.0,
            maximum=7200.0,
            range_source=f"CANN {CANN_CONNECT_ENV}",
            source=(f"{_PGH}:3980-3992 (collective: getHCCLComm), {_PGH}:2600-2627 (the communicator is created "
                    f"on a cache miss, at the group's first collective), {_PGH}:3635-3676 (get_hccl_comm_name with "
                    f"init_comm creates it), {_PGH}:4771-4783 (batch_isend_irecv: a collective on the group's "
                    f"communicator), {_PGH}:4428-4439 (a plain send/recv: a communicator per pair of ranks, unless "
                    f"coalescing or P2P_HCCL_BUFFSIZE=0), {CANN_EI0006}, {CANN_CONNECT_ENV} ([120, 7200])"),
        ),
        comm_memory=CommMemory(
            env="HCCL_BUFFSIZE",
            default_mb=200,
            p2p_env="P2P_HCCL_BUFFSIZE",
            p2p_default_mb=20,
            buffers=2,
            config_key="hccl_config.hccl_buffer_size",
            refusal="HCCL_BUFFSIZE should be positive.",
            source=(f"{_OPTS}:541-568 (GetHcclBufferSize: 200 MB, refuses a value that is not positive; "
                    f"GetP2PBufferSize: 20 MB), {_PGH}:305-312 (getHcclCommConfig), {_PGH}:3818-3824 (a group's "
                    f"hccl_config['hccl_buffer_size'] replaces it), {_PGH}:4428-4434 (a point-to-point communicator "
                    f"per pair of ranks), {CANN_BUFFSIZE_ENV} (2 x HCCL_BUFFSIZE per communicator)"),
        ),
        patches=(
            *((TorchPatch(
                "torch.distributed.nn.functional._AllGatherBase.backward",
                "raises 'Backend not supported!' unless dist.get_backend(group) is nccl, xccl or hccl",
                f"{_PATCHES}:59-62, {_PT}distributed/nn/functional.py:8-30 (_allgather_base_backward_hccl)",
            ),) if npu.all_gather_backward else ()),
            TorchPatch(
                "torch.distributed.gather",
                "on NPU tensors calls the group's HCCL backend directly (group._get_backend(npu).allgather, or "
                "HCCL's gather in the compatible mode), never the group's own gather",
                f"{_PATCHES}:35-38, {_C10D}:167-279 (_gather)",
            ),
            TorchPatch(
                "torch.distributed.distributed_c10d.gather",
                "the same function under torch.distributed.distributed_c10d",
                f"{_PATCHES}:39-42, {_C10D}:167-279 (_gather)",
            ),
            TorchPatch(
                "torch.distributed.gather_object",
                "torch's gather_object calling torch_npu's gather (above): the same result; the root's objects "
                "reach it through an all_gather on NPU",
                f"{_PATCHES}:43-46, {_C10D} (_gather_object, after _gather)",
            ),
            TorchPatch(
                "torch.distributed.distributed_c10d.gather_object",
                "the same function under torch.distributed.distributed_c10d",
                f"{_PATCHES}:47-50, {_C10D} (_gather_object, after _gather)",
            ),
            TorchPatch(
                "torch.distributed.batch_isend_irecv",
                "on NPU tensors, with CANN 9.0 or newer on Atlas A2/A3 (Ascend910B1..B4_1, Ascend910_9362..9392): "
                "torch's coalescing manager over the group's own send/recv (xccl's dispatch on xccl's group); "
                "otherwise group._get_backend(npu).batch_isend_irecv directly; either way one batch on the group's "
                "communicator, which it connects",
                f"{_PATCHES}:27-30, {_C10D}:67 (_CANN_VERSION), {_C10D}:87-164 (_batch_isend_irecv), "
                f"{_PGH}:4771-4783, {_PGH}:6260-6375 (startCoalescing, endCoalescing)",
            ),
            TorchPatch(
                "torch.distributed.distributed_c10d.batch_isend_irecv",
                "the same function under torch.distributed.distributed_c10d",
                f"{_PATCHES}:31-34, {_C10D}:87-164 (_batch_isend_irecv)",
            ),
        ),
        faults=(
            VendorFault("EI0002", Fault.TIMEOUT, "a collective did not complete within HCCL_EXEC_TIMEOUT",
                        CANN_EI0002),
            VendorFault("EI0006", Fault.CONNECT,
                        "a communicator could not connect within HCCL_CONNECT_TIMEOUT: a member reached the group's "
                        "first collective late, or not at all", CANN_EI0006),
            # Device and link errors the watchdog saw, raised by torch_npu at the next collective's enqueue.
            *(VendorFault(error, Fault.PEER_LOST, f"{meaning}; torch_npu raises '{error} happened with workEnqueue.' "
                          "at the next collective", f"{_PGH}:620-637 (get_device_error), :3393-3401 (workEnqueue)")
              for error, meaning in (("HCCS LINK ERROR", "an HCCS link between NPUs failed"),
                                     ("UB LINK ERROR", "a UB link failed"),
                                     ("SUSPECT REMOTE ERROR", "a remote NPU or its link failed"),
                                     ("HCCL OP RETRY FAILED", "HCCL's retry of a failed operation failed"))),
            VendorFault("FORCE STOP", Fault.PEER_LOST, "the device's tasks were aborted (torch_npu's stop_device)",
                        f"{_PGH}:807-811, :3402-3407 (workEnqueue raises 'FORCE STOP.'), "
                        f"{_PT}csrc/core/npu/NPUQueue.cpp:538-541",
                        simulated_by="the simulated stop_device (xccl.plugin.SimStream.stop)"),
        ),
    )
