"""Graph IR and graph passes."""

from .graph import HETERO_DOMAIN, ONNX_DOMAIN, Graph, Node

__all__ = ["HETERO_DOMAIN", "ONNX_DOMAIN", "Graph", "Node"]
