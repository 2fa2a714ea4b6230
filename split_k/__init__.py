"""Split-kv for MLA decode: the planner (``split_k.planner``, plan layout documented there) and the
merge math (``split_k.merge_ref``). Knows nothing about pipelines and never imports ``mla``."""
from . import merge_ref, planner

__all__ = ["planner", "merge_ref"]
