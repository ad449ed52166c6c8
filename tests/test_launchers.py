"""Cluster launchers: ``xccl.init`` under Slurm, LSF, Kubeflow's PyTorchJob and MPI reads their variables, with the
rendezvous address by each launcher's conventions (``xccl.plugin.job_env``), and bad values are typed errors that
name the variable.

The multi-process cases run 2 real ranks on loopback over gloo, forked from a server that imported torch and xccl
once; each rank gets only the launcher's variables (no ``RANK``, ``MASTER_ADDR``...), as srun, jsrun, mpirun or the
Kubeflow operator would set them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import xccl
from xccl.plugin import JobEnv, job_env
from xccl.plugin._jobenv import first_node, tasks_per_node
from xccl.testing import free_port

#: Every variable any launcher sets: cleared in each rank before the case's own are set.
_LAUNCH_PREFIXES = ("SLURM_", "LSB_", "JSM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "PET_", "TORCHELASTIC_")
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
                "MASTER_PORT", "KUBERNETES_SERVICE_HOST", "XCCL_SIMULATE", "XCCL_VENDOR")


def _rank_main(env: Mapping[str, str], out: Any) -> None:
    for k in list(os.environ):
        if k in _LAUNCH_VARS or k.startswith(_LAUNCH_PREFIXES):
            del os.environ[k]
    os.environ.update(env)
    import torch

    try:
        job = job_env()
        world = xccl.init(timeout=20)
        t = torch.tensor([float(world.rank + 1)])
        xccl.all_reduce(t)
        out.put({"ok": True, "source": job.source, "rank": world.rank, "size": world.world_size,
                 "local": world.local_rank, "sum": t.item(), "store": f"{job.master_addr}:{job.master_port}"})
        xccl.shutdown()
    except Exception as exc:  # reported to the test
        out.put({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def _launch(envs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Run one rank per environment; what each saw, in rank order (every wait bounded)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "xccl"])
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(e, out), daemon=True) for e in envs]  # type: ignore[attr-defined]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in envs:
            got.append(out.get(timeout=90))
    except queue.Empty:
        pytest.fail(f"ranks did not report in 90 s: {got}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    bad = [g for g in got if not g["ok"]]
    assert not bad, bad
    return sorted(got, key=lambda g: g["rank"])


def _free(ports: Callable[[int], int]) -> int:
    """The first ``i`` whose derived port ``ports(i)`` is free on loopback now."""
    for i in range(1, 1000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", ports(i)))
            except OSError:
                continue
            return i
    raise RuntimeError("no free port in the derived range")


def _check(got: list[dict[str, Any]], source: str, locals_: list[int], store: str) -> None:
    assert [(g["source"], g["rank"], g["size"], g["sum"]) for g in got] == [(source, 0, 2, 3.0), (source, 1, 2, 3.0)]
    assert [g["local"] for g in got] == locals_
    assert {g["store"] for g in got} == {store}


# ------------------------------------------------------------------------------------------------ real ranks


def test_slurm_ranks_rendezvous_on_the_first_node_at_the_job_id_port():
    i = _free(lambda i: 15000 + 7000 + i)
    job_id = f"98{7000 + i:04d}"  # Lightning's rule: 15000 + the last four digits
    common = {"SLURM_JOB_ID": job_id, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
              "SLURM_JOB_NODELIST": "127.0.0.[1-4]", "SLURM_JOB_NAME": "train"}
    got = _launch([{**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in range(2)])
    _check(got, "slurm", [0, 1], f"127.0.0.1:{15000 + 7000 + i}")


def test_lsf_ranks_rendezvous_on_the_first_host_of_the_rank_file(tmp_path: Path):
    i = _free(lambda i: 10000 + 500 + i)
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("launch-node\n127.0.0.1\n127.0.0.1\n")  # the first line is jsrun's launch node
    common = {"LSB_JOBID": str(31_000 + 500 + i), "LSB_DJOB_RANKFILE": str(rankfile), "JSM_NAMESPACE_SIZE": "2"}
    got = _launch([{**common, "JSM_NAMESPACE_RANK": str(r), "JSM_NAMESPACE_LOCAL_RANK": str(r)} for r in range(2)])
    _check(got, "lsf", [0, 1], f"127.0.0.1:{10000 + 500 + i}")


def test_kubeflow_pods_each_run_one_process_of_local_rank_zero():
    port = free_port()
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PET_NNODES": "2",
              "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    got = _launch([{**common, "RANK": str(r)} for r in range(2)])
    _check(got, "kubeflow", [0, 0], f"127.0.0.1:{port}")


def test_open_mpi_ranks_on_one_node_need_no_master_variables():
    i = _free(lambda i: 15000 + 3000 + i)
    common = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
              "OMPI_MCA_ess_base_jobid": str(1_279_320_000 + 3000 + i)}
    got = _launch([{**common, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r)} for r in range(2)])
    _check(got, "mpi", [0, 1], f"127.0.0.1:{15000 + 3000 + i}")


def test_mpich_ranks_with_master_variables():
    port = free_port()
    common = {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2", "MASTER_PORT": str(port)}
    got = _launch([{**common, "PMI_RANK": str(r), "MPI_LOCALRANKID": str(r)} for r in range(2)])
    _check(got, "mpi", [0, 1], f"127.0.0.1:{port}")


# ------------------------------------------------------------------------------------------------ the rules


def test_torchrun_wins_over_a_scheduler_and_explicit_ranks_over_slurm():
    slurm = {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n1"}
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert job_env({**slurm, **torchrun}).source == "torchrun"
    # A launcher run inside a one-task allocation (DeepSpeed's, Lightning's) numbers its processes itself.
    job = job_env({**slurm, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (job.source, job.rank, job.world_size, job.local_rank) == ("environment", 3, 4, 1)
    # Lightning treats an interactive allocation as no srun launch.
    assert job_env({**slurm, "SLURM_JOB_NAME": "interactive"}).source == "none"


def test_slurm_values_by_lightnings_conventions():
    env = {"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "3",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_ID": "4312345", "SLURM_NODELIST": "gpu[07-10]"}
    assert job_env(env) == JobEnv("slurm", 5, 8, 1, 2, 3, "gpu07", 17345, job_env(env).detail)
    assert job_env({**env, "MASTER_ADDR": "h", "MASTER_PORT": "29500"}).master_addr == "h"
    assert job_env({**env, "MASTER_PORT": "29500"}).master_port == 29500
    no_id = {k: v for k, v in env.items() if k not in ("SLURM_JOB_ID", "SLURM_NODELIST")}
    assert (job_env(no_id).master_addr, job_env(no_id).master_port) == ("127.0.0.1", 12910)


def test_the_first_node_of_a_slurm_node_list():
    assert first_node("node[001-004,007]") == "node001"
    assert first_node("a[5-9],b[1-2]") == "a5"
    assert first_node("rack[1-2]-n[3,5]") == "rack1-n3"  # two bracket groups: Lightning's regex gives "rack1"
    assert first_node("h0 h1") == "h0"
    assert first_node("localhost") == "localhost"
    assert first_node("n[3]") == "n3"


def test_slurm_tasks_per_node_expand():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]


@pytest.mark.parametrize(
    ("env", "phrase"),
    [
        ({"SLURM_JOB_NODELIST": "node[001-"}, "SLURM_JOB_NODELIST='node[001-' is not a Slurm node list"),
        ({"SLURM_NODELIST": "n[5-3]"}, "SLURM_NODELIST='n[5-3]' is not a Slurm node list: bad range"),
        ({"SLURM_NODELIST": "n]"}, "SLURM_NODELIST='n]'"),
        ({"SLURM_TASKS_PER_NODE": "2(x)"}, "SLURM_TASKS_PER_NODE='2(x)' is not a Slurm task count list"),
        ({"SLURM_PROCID": "one"}, "SLURM_PROCID='one' is not an integer"),
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2, SLURM_NTASKS=2"),
        ({"SLURM_LOCALID": "-1"}, "SLURM_LOCALID='-1' is negative"),
        ({"SLURM_JOB_ID": "12ab"}, "SLURM_JOB_ID='12ab' does not end in digits"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
    ],
    ids=["nodelist-open", "nodelist-range", "nodelist-close", "tasks-per-node", "procid", "procid-range",
         "localid", "job-id", "port"],
)
def test_bad_slurm_values_are_init_errors_naming_the_variable(env, phrase):
    base = {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n1"}
    with pytest.raises(xccl.InitError) as info:
        job_env({**base, **env})
    assert phrase in str(info.value)


def test_bad_lsf_rank_file_is_an_init_error(tmp_path: Path):
    env = {"LSB_JOBID": "1", "JSM_NAMESPACE_LOCAL_RANK": "0", "JSM_NAMESPACE_SIZE": "1", "JSM_NAMESPACE_RANK": "0"}
    with pytest.raises(xccl.InitError, match=r"LSB_DJOB_RANKFILE=.* cannot be read"):
        job_env({**env, "LSB_DJOB_RANKFILE": str(tmp_path / "absent")})
    (tmp_path / "only-launch").write_text("launch\n")
    with pytest.raises(xccl.InitError, match="lists no compute host"):
        job_env({**env, "LSB_DJOB_RANKFILE": str(tmp_path / "only-launch")})


def test_kubeflow_with_several_processes_per_pod_needs_torchrun():
    env = {"RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "m", "MASTER_PORT": "23456", "PET_NNODES": "2",
           "PET_NPROC_PER_NODE": "4"}
    with pytest.raises(xccl.InitError, match=r"PET_NPROC_PER_NODE=4.*torchrun"):
        job_env(env)


def test_mpi_across_nodes_without_master_variables_says_what_to_export():
    env = {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(xccl.InitError, match=r"MASTER_ADDR and MASTER_PORT for a job across nodes.*-genv"):
        job_env(env)
    one_node = {**env, "MPI_LOCALNRANKS": "4"}  # MPICH exports no job id to derive a port from
    with pytest.raises(xccl.InitError, match="no rendezvous MASTER_PORT:"):
        job_env(one_node)


def test_doctor_says_which_launcher_it_found():
    from xccl.tools.cli.doctor_node import rendezvous

    env = {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "77",
           "SLURM_JOB_NODELIST": "node[001-004]"}
    found = {f.name: f for f in rendezvous(env)}
    assert found["launcher"].status == "ok" and found["launcher"].summary.startswith("found slurm: rank 1 of 2")
    assert found["store"].summary.startswith("node001:15077")
    bad = {f.name: f for f in rendezvous({**env, "SLURM_JOB_NODELIST": "node[001"})}
    assert bad["launcher"].status == "fail" and "SLURM_JOB_NODELIST" in bad["launcher"].summary
