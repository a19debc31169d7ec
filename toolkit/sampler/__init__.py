"""The sampler: per-request parameters (params.py), their state (state.py), a step's staged inputs
(batch.py) and the fast/slow sampling path (sampler.py)."""

from .params import SamplingParams

__all__ = ["SamplingParams"]
