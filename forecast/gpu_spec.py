"""The GPU specification record (`GPUSpec`), its error (`GPUError`) and the one-line messages a
file's validation failure becomes (`first_error`). `forecast.gpus` reads the files.

Every quantity is SI with the unit in its name.
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from forecast.kernels import Dtype

# numbers must be numbers: pydantic's lax mode read num_sms = "132" as 132 and a rate of
# true as 1.0 (an H100 of 1 byte/s); strict ints refuse floats too (num_sms = 132.5)
_Int = Annotated[int, Strict()]
_Float = Annotated[float, Strict()]
SHEET_SOURCE = "NeuSight device sheet"  # the first source of a spec read from one
# what FlashAttention's and the tile picker's rules read ("sm_90" or "abc" passed as a GPU of
# unknown capability, given FlashAttention-2 on the benefit of the doubt)
COMPUTE_CAPABILITY = r"^([1-9][0-9]?\.[0-9]|gfx[0-9a-f]{3,4}|unknown)$"


class GPUError(ValueError):
    """A GPU that cannot be found or read; the message names the fix."""


class GPUSpec(BaseModel):
    """One GPU model. Peak rates are dense (no sparsity), at the boost clock.

    Every number is positive and finite; a dtype without a peak is left out, not set to 0.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    id: str
    name: str
    vendor: str
    architecture: str
    compute_capability: str = Field(
        pattern=COMPUTE_CAPABILITY,
        description="NVIDIA sm version ('8.0') or AMD ISA ('gfx90a'); 'unknown' for neither",
    )
    process_nm: _Float | None = Field(
        default=None, gt=0, description="process node of the GPU die, nm class (TSMC 4N: 5)"
    )
    num_sms: _Int = Field(gt=0, description="SMs (NVIDIA) or compute units (AMD)")
    fp32_lanes_per_sm: _Int = Field(gt=0, description="FP32 FMA lanes per SM or CU")
    fp32_dedicated_lanes_per_sm: _Int = Field(
        gt=0,
        description="FP32 lanes not shared with INT32 (GA10x/AD10x: 64 of 128); = lanes elsewhere",
    )
    boost_clock_hz: _Float = Field(gt=0)
    base_clock_hz: _Float | None = Field(default=None, gt=0)
    tdp_w: _Float | None = Field(default=None, gt=0)
    memory_type: str = Field(default="unknown", description="DRAM technology: HBM2e, GDDR6, ...")
    # Memory a program can allocate. NVIDIA's HBM capacities ("80 GB") are binary: HBM dies
    # come in 2^30-byte multiples and nvidia-smi shows an A100 80GB as 81920 MiB, a 40GB as
    # 40960 MiB (modal-labs/modal-client#2797; CUDA's deviceQuery gives the 40GB 42.30e9
    # allocatable bytes, 98.5% of 40 GiB, inside the simulator's 1 GiB reserve). Read as 1e9
    # bytes, an 80 GB GPU held 7% less than it has. GDDR boards are decimal (an L4's "24 GB"
    # shows as 23034 MiB = 24.15e9 bytes with ECC on); AMD's ROCm table quotes GiB.
    hbm_bytes: _Float = Field(gt=0, description="device memory, bytes (name kept for GDDR too)")
    hbm_bw_bytes_per_s: _Float = Field(gt=0)
    l2_bytes: _Float = Field(gt=0)
    smem_bytes_per_sm: _Float | None = Field(default=None, gt=0)
    regs_bytes_per_sm: _Float | None = Field(default=None, gt=0)
    peak_flops_per_s: dict[Dtype, Annotated[float, Strict(), Field(gt=0)]] = Field(
        description="dense peak per dtype: fp32 = CUDA-core/vector rate, others = tensor/matrix"
    )
    fp32_matrix_flops_per_s: _Float | None = Field(
        default=None, gt=0, description="AMD 'Matrix FP32' (MFMA) peak, used by FP32 GEMMs"
    )
    neusight_names: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def peak_for(self, dtype: Dtype) -> float:
        """Peak FLOP/s for a dtype, or a `GPUError` naming the dtypes this GPU supports."""
        if dtype not in self.peak_flops_per_s:
            have = ", ".join(sorted(self.peak_flops_per_s))
            # a device sheet gives FP32 alone: say the peaks come from one
            sheet = self.sources and self.sources[0].startswith(SHEET_SOURCE)
            where = f" ({self.sources[0]})" if sheet else ""
            raise GPUError(
                f"dtype {dtype.value}: {self.id}{where} has no {dtype.value} peak on file; use "
                f"one of {have}, or a GPU file that gives a {dtype.value} peak"
            )
        return self.peak_flops_per_s[dtype]


def first_error(e: ValidationError) -> str:
    """Pydantic's first complaint as ``field 'a.b': message`` (one line).

    An unknown key comes first, with the field it most resembles: a misspelt required field
    is both unknown and missing, and only the unknown key names what the user typed.
    """
    errors = e.errors()
    unknown = [x for x in errors if x["type"] == "extra_forbidden" and len(x["loc"]) == 1]
    if unknown:
        key = str(unknown[0]["loc"][0])
        fields = [f for f in GPUSpec.model_fields if f != "id"]
        near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
        if near:
            return f"field {key!r} is not a GPU field; did you mean {near[0]!r}?"
        return f"field {key!r} is not a GPU field; remove it (fields: {', '.join(fields)})"
    first = errors[0]
    loc = ".".join(str(x) for x in first["loc"] if x != "[key]")  # a bad dict key: its name
    if first["type"] in ("finite_number", "greater_than"):
        return f"field {loc!r} must be a positive finite number, got {first['input']!r}"
    if first["type"] in ("int_type", "float_type"):
        return f"field {loc!r} {_not_a_number(first['type'], first['input'])}"
    if first["type"] == "string_pattern_mismatch" and loc == "compute_capability":
        return (
            f"field 'compute_capability' is {json.dumps(first['input'])}; give the NVIDIA sm "
            "version as MAJOR.MINOR in quotes ('9.0'), the AMD ISA ('gfx90a') or 'unknown'"
        )
    if first["type"] == "string_type":
        return f"field {loc!r} must be a string in quotes, got {json.dumps(first['input'])}"
    return f"field {loc!r}: {first['msg']}"


def _not_a_number(kind: str, value: object) -> str:
    """Why a strict number field refused ``value`` (pydantic's int_type or float_type), and
    the fix, as TOML spells the value: "132" is a string, true a boolean."""
    want = "a positive whole number" if kind == "int_type" else "a positive number"
    if isinstance(value, bool):
        return f"must be {want}, got {json.dumps(value)}; write a number, not true or false"
    if isinstance(value, str):
        return f"must be {want}, got {json.dumps(value)}; write the number bare (no quotes)"
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return f"must be {want}, got {value!r}; write {int(value)}"
    return f"must be {want}, got {value!r}"
