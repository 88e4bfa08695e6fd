"""``tilesim serve`` against closed forms (audit of session 16).

* Tensor-parallel collectives move the hidden states' element type: bf16 under Megatron's fp8
  (TransformerEngine's GEMMs return bf16, the output layer is a bf16 GEMM), as the training
  collectives count them (`simulator.comm`); they were counted at 1 byte an element, half.
* fp8 serving under Megatron holds 1-byte weights for the layers' linears only: the token
  table, the output head and the norms are bf16 ops and bf16 weights (every weight was 1 byte).
"""

from __future__ import annotations

import pytest

from forecast.gpus import load_gpu
from forecast.kernels import Dtype
from simulator.latency import latency_model_for
from simulator.memory import GIB
from simulator.models import load_model
from simulator.serve import serve_forecast
from simulator.serve_request import ServeRequest
from topologies import collective_estimate
from topologies.catalog import load_cluster

H100 = "h100-sxm5-80gb"
DERATED = latency_model_for("roofline-derated")


@pytest.mark.parametrize(("framework", "item"), [("megatron", 2), ("hf-eager", 1)])
def test_fp8_tensor_parallel_collectives_move_the_hidden_states_type(
    framework: str, item: int
) -> None:
    """Llama 3 70B over a DGX H100's 8 GPUs, one 8-token prompt, one token: 2 x 80 + 1
    all-reduces of 8 x 8192 activations and one all-gather of 128,256 logits, in bf16 under
    Megatron's fp8 (it counted 1 byte) and in fp8 where HF eager runs every op in fp8."""
    m, gpu, cluster = load_model("llama3-70b"), load_gpu(H100), load_cluster("dgx-h100", gpus=8)
    req = ServeRequest(batch=1, prompt=8, gen=1, tp=8, dtype=Dtype.FP8, framework=framework)
    res = serve_forecast(m, gpu, req, DERATED, cluster=cluster)
    ar = collective_estimate("all-reduce", 8 * 8192 * item, range(8), cluster).time_s
    ag = collective_estimate("all-gather", 128256 * item, range(8), cluster).time_s
    assert res.comm_ms == pytest.approx((161 * ar + ag) * 1e3)


def test_fp8_serving_weights_are_one_byte_linears_and_bf16_tables() -> None:
    """Llama 3 8B in fp8: 32 layers x (4096 x 6144 QKV + 4096 x 4096 projection + 3 x 4096 x
    14336 MLP) = 6,979,321,856 one-byte GEMM weights, and 2 x 128,256 x 4096 untied table and
    head plus 65 x 4096 norms = 1,050,939,392 bf16 weights: 9,081,200,640 bytes, 8.457 GiB (it
    counted 8,030,261,248 x 1 = 7.479 GiB)."""
    m, gpu = load_model("llama3-8b"), load_gpu(H100)
    gemm = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    rest = 2 * 128256 * 4096 + 65 * 4096
    assert (gemm, rest) == (6_979_321_856, 1_050_939_392)
    assert m.num_params() == gemm + rest
    req = ServeRequest(batch=1, prompt=1024, gen=128, dtype=Dtype.FP8)
    res = serve_forecast(m, gpu, req, DERATED)
    assert res.weights_gib * GIB == gemm + 2 * rest == 9_081_200_640
    # HF eager runs every op, the head's GEMM included, in fp8: 1 byte a weight
    eager = serve_forecast(m, gpu, req.model_copy(update={"framework": "hf-eager"}), DERATED)
    assert eager.weights_gib * GIB == m.num_params()
