"""The rules a `RunConfig` meets against its model and cluster, each refusal one `ConfigError`
naming the key to change and the rule (`parallel.check_run` applies them in order)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.errors import ConfigError
from simulator.models import ModelSpec

if TYPE_CHECKING:  # parallel imports this module
    from simulator.parallel import RunConfig


def _need(ok: bool, key: str, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {rule}")


def check_sizes(run: RunConfig, model: ModelSpec, num_gpus: int) -> int:
    """The data-parallel size: tp divides the heads, tp*cp*pp*dp fills the cluster, ep divides
    dp*cp and the experts, a MoE model under tp runs sequence parallelism."""
    _need(model.num_heads % run.tp == 0, "run.tp", f"must divide n_heads = {model.num_heads}")
    _need(model.kv_heads % run.tp == 0, "run.tp", f"must divide n_kv_heads = {model.kv_heads}")
    per_replica = run.tp * run.cp * run.pp
    dp = run.dp or num_gpus // per_replica
    fix = (
        f"set run.dp = {num_gpus // per_replica} (or 0 to take the GPUs left over)"
        if num_gpus % per_replica == 0
        else f"tp*cp*pp = {per_replica} must divide it: change run.tp, run.cp or run.pp"
    )
    _need(
        dp * per_replica == num_gpus,
        "run.dp",
        f"tp*cp*pp*dp = {run.tp}*{run.cp}*{run.pp}*{dp} must equal cluster.num_gpus = "
        f"{num_gpus}; {fix}",
    )
    _need((dp * run.cp) % run.ep == 0, "run.ep", f"must divide dp*cp = {dp * run.cp}")
    _check_a2a_heads(run, model)
    _need(
        model.num_experts % run.ep == 0,
        "run.ep",
        "is for expert parallelism, and this model is dense (no experts); set run.ep = 1"
        if model.num_experts == 1
        else f"must divide the number of experts ({model.num_experts}); pick a divisor of it",
    )
    # Megatron-LM refuses MoE with tensor parallelism but without sequence parallelism
    # (megatron/training/arguments.py: "When using MoE and tensor parallelism, sequence
    # parallelism must be used"; its token dispatchers split the tokens over the TP ranks)
    _need(
        model.num_experts == 1 or run.tp == 1 or run.sequence_parallel,
        "run.sequence_parallel",
        f"must be true for a MoE model at run.tp = {run.tp} (Megatron-LM runs experts with "
        "tensor parallelism only under sequence parallelism); set it, or run.tp = 1",
    )
    return dp


def _check_a2a_heads(run: RunConfig, model: ModelSpec) -> None:
    """Ulysses (``cp_comm_type = "a2a"``) gives each CP rank ``1 / cp`` of a TP rank's heads:
    TransformerEngine asserts that ``cp`` divides both the query and the key/value heads of a
    TP rank (``AttnFuncWithCPAndQKVOA2A``: "The number of attention heads needs to be divisible
    by CP size!")."""
    if run.cp == 1 or run.cp_comm_type != "a2a":
        return
    q, kv = model.num_heads // run.tp, model.kv_heads // run.tp
    _need(
        q % run.cp == 0 and kv % run.cp == 0,
        "run.cp_comm_type",
        f"a2a splits a TP rank's heads over cp = {run.cp}, but n_heads / tp = {q} and "
        f"n_kv_heads / tp = {kv} are not both divisible by it; use p2p or all_gather, or a cp "
        "that divides them",
    )


def check_schedule(run: RunConfig, layers: int, m: int) -> None:
    """Virtual stages need the interleaved schedule, which needs ``m`` a multiple of pp and
    every model chunk the same layers; pp*virtual_stages stages hold at least a layer each."""
    v = run.virtual_stages
    interleaved = run.schedule == "1f1b-interleaved"
    _need(v == 1 or interleaved, "run.virtual_stages", "> 1 needs schedule = 1f1b-interleaved")
    _need(layers >= run.pp * v, "run.pp", f"pp*virtual_stages must be <= n_layers = {layers}")
    if interleaved and v > 1:
        _need(
            m % run.pp == 0,
            "run.schedule",
            f"interleaved needs the micro-batches per replica ({m}) to be a multiple of pp = "
            f"{run.pp}; change training.global_batch_size or run.micro_batch_size, or set "
            "run.virtual_stages = 1",
        )
        # Megatron-LM's interleaved schedule gives every model chunk the same layers (uneven
        # splits, remainder to the middle stages, are for v = 1 only)
        _need(
            layers % (run.pp * v) == 0,
            "run.virtual_stages",
            f"interleaved needs n_layers = {layers} divisible by pp*virtual_stages = "
            f"{run.pp}*{v}; pick pp and virtual_stages whose product divides it",
        )


def check_tp_nodes(tp: int, gpus_per_node: int) -> None:
    """A TP group sits inside one node or spans whole nodes."""
    n = gpus_per_node
    _need(
        n % tp == 0 or tp % n == 0,
        "run.tp",
        f"must divide the {n} GPUs of a node or be a multiple of them (a TP group of "
        f"{tp} would straddle two nodes)",
    )


def micro_batches(run: RunConfig, dp: int, *, global_batch_size: int, seq_len: int) -> int:
    """Micro-batches per step of one DP replica; the global batch must split into whole ones,
    and the sequence into ``2 cp`` load-balanced chunks over the CP ranks."""
    per_step = run.micro_batch_size * dp
    _need(
        global_batch_size % per_step == 0,
        "training.global_batch_size",
        f"must be a multiple of micro_batch_size*dp = {per_step}",
    )
    # Megatron-LM's get_batch_on_this_cp_rank cuts the sequence into 2*cp chunks (rank r
    # keeps r and 2cp-1-r) and TransformerEngine asserts each rank's share is even
    chunks = 2 * run.cp if run.cp > 1 else 1
    _need(
        seq_len % chunks == 0,
        "run.cp",
        f"CP cuts the sequence into 2*cp = {chunks} chunks, so seq_len = {seq_len} must be a "
        "multiple of 2*cp",
    )
    return global_batch_size // per_step
