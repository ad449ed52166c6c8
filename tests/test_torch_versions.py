"""The torch releases xccl supports (2.7 to 2.14): each difference in ``xccl.ops._torch`` against the installed
torch, and what xccl makes of it. CI runs this file on torch 2.13 and in the compatibility tier on 2.7.1, 2.8.0 and
2.14.1 (``make test-torch``), so every fact is checked on a torch that has it and on one that lacks it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import xccl
from xccl.ops import _torch as T

pytestmark = pytest.mark.compat

# What torch itself has, read in a fresh process that never imported xccl (xccl registers torch 2.11's autograd
# formulas on an older torch and puts its own shrink_group in torch.distributed).
_API_PROBES = {
    T.ASYNC_OP: "hasattr(torch.distributed.AllreduceOptions(), 'asyncOp')",
    T.GLOO_GROUP_OPTIONS: "hasattr(torch._C._distributed_c10d.ProcessGroupGloo._Options(), 'group_name')",
    T.SHRINK_GROUP: "hasattr(torch.distributed.distributed_c10d, '_validate_shrink_inputs')",
    T.FAKE_PG_INTERNAL: "hasattr(torch._C._distributed_c10d.FakeProcessGroup, '_create_internal')",
    T.FUNCOL_AUTOGRAD: "torch._C._dispatch_has_kernel_for_dispatch_key('_c10d_functional::all_reduce', 'Autograd')",
    T.DYNAMO_PYBIND: "folds()",
}
_PROBE = """
import torch, torch.distributed, torch.distributed._functional_collectives
def folds():
    R = torch.distributed.ReduceOp
    try:
        torch.compile(lambda x, op=R.MAX: x + (op == R.MAX), fullgraph=True, backend="eager")(torch.zeros(1))
    except Exception:
        return False
    return True
print([bool(p) for p in [{probes}]])
"""


def test_each_api_change_is_what_the_installed_torch_has() -> None:
    code = _PROBE.format(probes=", ".join(_API_PROBES.values()))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = dict(zip(_API_PROBES, eval(out.stdout.strip().splitlines()[-1]), strict=True))
    wrong = [f"{c.what}: xccl says {T.TORCH.has(c)} for torch {torch.__version__}, torch says {has}"
             for c, has in found.items() if T.TORCH.has(c) != has]
    assert not wrong, wrong


def body_gloo_facts() -> dict[str, bool]:
    """What a plain gloo group of this torch does (no xccl in the path)."""
    g, rank, n = dist.new_group(backend="gloo"), dist.get_rank(), dist.get_world_size()
    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, torch.full((n,), float(rank + 1)), op=dist.ReduceOp.MAX, group=g)
    found = {"rs_ops": out.item() == n}
    for name, call in (
        ("rs_list", lambda: dist.reduce_scatter(out, [torch.ones(1)] * n, group=g)),
        ("avg", lambda: dist.all_reduce(torch.ones(1), op=dist.ReduceOp.AVG, group=g)),
        ("a2a", lambda: dist.all_to_all([torch.empty(1)] * n, [torch.ones(1)] * n, group=g)),
    ):
        try:
            call()
            found[name] = True
        except RuntimeError:
            found[name] = False
    dist.destroy_process_group(g)
    return found


def test_each_gloo_change_is_what_the_installed_torch_does(rank_pools: Any) -> None:
    found = rank_pools.get(2).run_ok(body_gloo_facts, timeout=120)[0]
    said = {"rs_ops": T.GLOO_REDUCE_SCATTER_OPS, "rs_list": T.GLOO_REDUCE_SCATTER, "avg": T.GLOO_AVG,
            "a2a": T.GLOO_ALL_TO_ALL}
    assert found == {k: T.TORCH.has(c) for k, c in said.items()}, found


# ------------------------------------------------------------------------------------------ reduce_scatter


_OPS = ("sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor")


def body_reduce_scatter_every_op() -> dict[str, str]:
    """reduce_scatter_tensor and the list reduce_scatter, each reduce op, through xccl and through dist.* on xccl's
    group: the exact result, or a typed refusal (on every rank alike). Rank r sends ``x_r = [r+1, r+2]`` to every
    rank, so each receives the reduction of every ``x_r``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    got: dict[str, str] = {}
    for name in _OPS:
        dtype = torch.int32 if name.startswith("b") else torch.float32
        op = dist._make_nccl_premul_sum(2.0) if name == "premul_sum" else getattr(dist.ReduceOp, name.upper())
        every = [torch.arange(2, dtype=dtype) + r + 1 for r in range(n)]
        fold = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor, "sum": torch.add,
                "avg": torch.add, "premul_sum": torch.add, "product": torch.mul, "min": torch.minimum,
                "max": torch.maximum}[name]
        right = every[0]
        for t in every[1:]:
            right = fold(right, t)
        right = right / n if name == "avg" else 2 * right if name == "premul_sum" else right
        for via, call in (
            ("xccl", lambda out, x, op=op: xccl.reduce_scatter_tensor(out, torch.cat([x] * n), op)),
            ("dist", lambda out, x, op=op: dist.reduce_scatter_tensor(out, torch.cat([x] * n), op)),
            ("list", lambda out, x, op=op: dist.reduce_scatter(out, [x.clone() for _ in range(n)], op)),
        ):
            out = torch.empty(2, dtype=dtype)
            try:
                call(out, every[rank])
            except xccl.UnsupportedCollective:
                got[f"{name} {via}"] = "refused"
                continue
            got[f"{name} {via}"] = "right" if torch.allclose(out.double(), right.double()) else f"wrong {out.tolist()}"
    return got


@pytest.mark.parametrize("vendor", ["cpu", "ascend", "sophgo"])
def test_reduce_scatter_with_every_reduce_op_is_right_or_refused(rank_pools: Any, vendor: str) -> None:
    kwargs: dict[str, Any] = {} if vendor == "cpu" else {"vendor": vendor, "simulate": True}
    size = 4 if vendor == "sophgo" else 2
    outs = rank_pools.get(size, **kwargs).run_ok(body_reduce_scatter_every_op, timeout=300)
    assert all(o == outs[0] for o in outs), "ranks disagree"
    wrong = {k: v for k, v in outs[0].items() if v not in ("right", "refused")}
    assert not wrong, wrong
    if vendor == "cpu":  # every op runs on cpu, whatever this torch's gloo does with it
        assert set(outs[0].values()) == {"right"}, outs[0]


# -------------------------------------------------------------------------------------------- the floor


def test_import_below_the_floor_says_which_torch_xccl_needs_and_why(tmp_path: Path) -> None:
    """On torch 2.1 every layer of xccl fails at torch.uint16; ``import xccl`` says why first, in one line, without
    importing torch (the stand-in torch fails if it is imported)."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the stand-in torch was imported')\n")
    (fake / "version.py").write_text("__version__ = '2.1.0+cu121'\n")
    code = textwrap.dedent("""
        try:
            import xccl
        except Exception as exc:
            print(type(exc).__name__, exc.needs, exc.installed, str(exc).count(chr(10)))
            print(exc)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    first, message = out.stdout.splitlines()[:2]
    assert first == "UnsupportedTorch 2.7 2.1.0+cu121 0", out.stdout + out.stderr
    assert "xccl needs torch >= 2.7" in message and "subclass c10d's ProcessGroup" in message
    # The command says it in one line too, with no traceback.
    cli = "import sys, xccl_cli; sys.argv = ['xccl', 'caps']; sys.exit(xccl_cli.main())"
    out = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, timeout=120, env=env)
    assert (out.returncode, out.stderr.count("\n"), out.stdout) == (2, 1, ""), out.stderr
    assert out.stderr.startswith("xccl: xccl needs torch >= 2.7, and torch 2.1.0+cu121 is installed")


# -------------------------------------------------------------------------------------- refused features


def body_shrink_refused() -> tuple[str, list[float]]:
    try:
        dist.shrink_group([1])
    except xccl.UnsupportedTorch as exc:
        said = f"{exc.feature} {exc.needs}"
    t = torch.ones(1)
    xccl.all_reduce(t)  # nothing was torn down
    return said, t.tolist()


@pytest.mark.skipif(T.TORCH.has(T.SHRINK_GROUP), reason="this torch has shrink_group")
def test_shrink_group_is_refused_before_anything_is_torn_down(rank_pools: Any) -> None:
    outs = rank_pools.get(2).run_ok(body_shrink_refused, timeout=120)
    assert outs == [("dist.shrink_group 2.10", [2.0])] * 2
