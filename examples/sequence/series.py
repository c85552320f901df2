"""The data of the sequence example: noisy sine waves, made here with numpy.

Each series is ``a * sin(w * t + phase)`` sampled at integer steps ``t`` with a random
amplitude ``a`` in [0.5, 1.5], angular frequency ``w`` in [0.15, 0.6] rad per step and
phase, observed with Gaussian noise (standard deviation :data:`NOISE`). The task of the
model: after each observation, predict the *clean* value of the next step. It has to
infer amplitude, frequency and phase from what it has seen so far, so its answers depend
on the whole history of the sequence, which is what a sequence batcher must keep.

``build_model.py`` (training, checks) and ``client.py`` (streaming) both use it; it
needs numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NOISE", "WARMUP_STEPS", "noisy_sines", "rmse"]

#: standard deviation of the observation noise (same unit as the signal).
NOISE = 0.1
#: steps at the start of a sequence left out of error figures: before a few
#: observations no predictor can know the frequency.
WARMUP_STEPS = 8


def noisy_sines(rng: np.random.Generator, count: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random series of ``length`` steps.

    Returns:
        ``(observed, target)``, both FP32 of shape ``[count, length]``: ``observed[i, t]``
        is the noisy value at step ``t``; ``target[i, t]`` the clean value at step
        ``t + 1`` (what a prediction made after observing step ``t`` is scored against).
    """
    amplitude = rng.uniform(0.5, 1.5, (count, 1))
    frequency = rng.uniform(0.15, 0.6, (count, 1))
    phase = rng.uniform(0.0, 2.0 * np.pi, (count, 1))
    t = np.arange(length + 1)[np.newaxis, :]
    clean = amplitude * np.sin(frequency * t + phase)
    observed = clean[:, :length] + rng.normal(0.0, NOISE, (count, length))
    return observed.astype(np.float32), clean[:, 1:].astype(np.float32)


def rmse(predicted: np.ndarray, target: np.ndarray) -> float:
    """Root mean square error over the steps after :data:`WARMUP_STEPS` (the last axis
    is the step; NaN when there are none)."""
    tail = (np.asarray(predicted, np.float64) - target)[..., WARMUP_STEPS:]
    return float(np.sqrt(np.mean(tail**2))) if tail.size else float("nan")
