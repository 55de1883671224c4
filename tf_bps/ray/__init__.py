"""tf_bps on a Ray cluster, with Horovod's Ray API (`pip install tf_bps[ray]`):

    from tf_bps.ray import ElasticRayExecutor, RayExecutor

is what `from horovod.ray import ElasticRayExecutor, RayExecutor` was. Under Ray
Train's TensorflowTrainer, which sets TF_CONFIG for its workers, nothing here is
needed: bps.init() and tf_bps.ParameterServerStrategy() place themselves from it.
"""

try:
    import ray  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError("tf_bps.ray needs Ray: pip install 'tf_bps[ray]' (or ray)") from error

from tf_bps.ray.elastic import ElasticRayExecutor, ElasticRaySettings
from tf_bps.ray.executor import RayExecutor, RaySettings

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayExecutor", "RaySettings"]
