"""bps.Compression: what push_pull itself takes (runtime/compression.py), and PowerSGD,
which needs a step's gradients and the state kept between steps, so it is a choice of
the training wrappers and the strategy, not of a single push_pull."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tf_bps.runtime import compression

if TYPE_CHECKING:
    from tf_bps.training.powersgd import PowerSGD


class Compression(compression.Compression):
    @staticmethod
    def powersgd(rank: int = 1, start_iter: int = 1000, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 seed: int = 0) -> PowerSGD:
        """Low-rank compression (PowerSGD, as PyTorch's powerSGD_hook) of gradients of
        rank >= 2: see powersgd.py. The object keeps each gradient's state from step to
        step: make it once and pass it to every step's tape."""
        # Imported here: bps.Compression is there before TensorFlow is imported.
        from tf_bps.training.powersgd import PowerSGD

        return PowerSGD(rank, start_iter, min_compression_rate, use_error_feedback,
                        warm_start, seed)
