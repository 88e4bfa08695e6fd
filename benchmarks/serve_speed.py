"""Time `tilesim serve` forecasts: Llama 3 8B on one H100 and Llama 3 70B over a DGX H100
at tp 8, 1,024-token prompts, 128 and 2,048 generated tokens (the latter forecasts 256 decode
passes and interpolates the rest: `simulator.serve_request.MAX_DECODE_SAMPLES`).

Run: ``python benchmarks/serve_speed.py``. No target; prints seconds per forecast, the first
one including loading the latency model.
"""

from __future__ import annotations

import time

from forecast.gpus import load_gpu
from simulator.latency import latency_model_for
from simulator.models import load_model
from simulator.serve import serve_forecast
from simulator.serve_request import ServeRequest
from topologies.catalog import load_cluster


def main() -> None:
    """Print one line per forecast."""
    latency = latency_model_for("auto")
    gpu = load_gpu("h100-sxm5-80gb")
    cases = [
        ("llama3-8b", 1, 128, None),
        ("llama3-8b", 1, 2048, None),
        ("llama3-8b", 32, 2048, None),
        ("llama3-70b", 8, 2048, load_cluster("dgx-h100", gpus=8)),
    ]
    for model_id, batch, gen, cluster in cases:
        tp = 8 if cluster else 1
        req = ServeRequest(batch=batch, prompt=1024, gen=gen, tp=tp)
        t0 = time.perf_counter()
        res = serve_forecast(load_model(model_id), gpu, req, latency, cluster=cluster)
        dt = time.perf_counter() - t0
        print(
            f"{model_id} tp {tp} batch {batch} gen {gen}: forecast in {dt:.2f} s "
            f"(time per output token {res.tpot_ms:.2f} ms)"
        )


if __name__ == "__main__":
    main()
