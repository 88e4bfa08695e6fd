"""What `simulate` reports for one layout against its own critical path and the published closed
forms (helper-a's audit, session 15)."""

from __future__ import annotations

import pytest

from simulator.scenario import load_scenario, resolve
from simulator.scheduler import critical_path
from simulator.simulate import latency_table, simulate_timeline
from simulator.space import find_scenario

TINY = find_scenario("tiny-gpt-8gpu")
# Llama-style (untied head, RMSNorm) on 2 stages: the last stage's head and final norm hold
# more parameters than stage 0's embedding, so its optimizer step is the longer one, while the
# step ends with stage 0's (1F1B and GPipe run stage 0's last backward last)
LLAMA_PP2 = (
    "model.n_layers=6",
    "model.activation='swiglu'",
    "cluster.num_gpus=2",
    "training.global_batch_size=16",
    "run.tp=1",
    "run.pp=2",
    "run.dp=1",
    "run.micro_batch_size=1",
)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_reported_optimizer_is_the_one_that_ends_the_step(schedule: str) -> None:
    """``optimizer_s`` is the optimizer step on the critical path, so that the critical path's
    compute + ``optimizer_s`` + the exposed communication is the step (the figure's parts;
    `plots._breakdown_s` takes compute as the remainder). It was the slowest stage's:
    7.0233e-05 s against 7.0228e-05 s on the path here."""
    scenario = load_scenario(TINY, overrides=(*LLAMA_PP2, f"run.schedule='{schedule}'"))
    inputs = resolve(scenario)
    res, t = simulate_timeline(inputs, scenario.run, latency_table(inputs, [scenario.run]))
    per_stage = t.step.costs.optimizer_s
    assert per_stage[1] > per_stage[0]  # the case this guards
    nodes = t.graph.nodes
    path = critical_path(t)
    (opt,) = [n for n in path if nodes[n]["kind"] == "optimizer"]
    assert res.optimizer_s == t.step.duration_s(opt) == per_stage[opt[1]]
    compute = sum(t.step.parts(n)["compute_s"] for n in path if nodes[n]["kind"] == "compute")
    total = compute + res.optimizer_s + sum(res.exposed_comm_s.values())
    assert total == pytest.approx(res.iteration_s, rel=1e-12)
