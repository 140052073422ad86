"""Validated inputs: GPU types, clusters, models, training settings and plans."""

from hetpp.specs.catalog import CATALOG, GpuType
from hetpp.specs.cluster import Cluster, Device, NodeGroup, load_cluster
from hetpp.specs.errors import SpecError
from hetpp.specs.model import LayerSpec, ModelConfig, ModelSpec
from hetpp.specs.plan import GradBlock, PipelinePlan, Plan, StagePlan, load_plan
from hetpp.specs.presets import PRESETS, load_model, load_model_config
from hetpp.specs.trainspec import TrainSpec

__all__ = [
    "CATALOG",
    "PRESETS",
    "Cluster",
    "Device",
    "GpuType",
    "GradBlock",
    "LayerSpec",
    "ModelConfig",
    "ModelSpec",
    "NodeGroup",
    "PipelinePlan",
    "Plan",
    "SpecError",
    "StagePlan",
    "TrainSpec",
    "load_cluster",
    "load_model",
    "load_model_config",
    "load_plan",
]
