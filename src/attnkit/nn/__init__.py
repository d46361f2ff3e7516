"""Attention mechanisms as torch modules (``nn.Module``), one file per family or paper."""

from ._recurrent import RecurrentCache
from .additive import AdditiveAttention
from .bigbird import BigBirdAttention
from .blocksparse import BlockPattern, BlockSparseAttention
from .coattention import CoAttention
from .coverage import CoverageAttention, coverage_loss
from .deltanet import DeltaNet
from .derived_key import DerivedKeyAttention
from .gated_deltanet import GatedDeltaNet
from .gla import GatedLinearAttention
from .hard import HardAttention
from .kimi_delta import KimiDeltaAttention
from .kv_cache import KVCache
from .lambda_layer import LambdaLayer
from .linear import LinearAttention, PerformerAttention
from .linformer import LinformerAttention, SequenceProjection
from .local import LocalAttention
from .longformer import LongformerAttention
from .luong import LuongAttention
from .mamba2 import Mamba2Mixer
from .memory import MemoryAttention
from .multihead import DotProductAttention, MultiHeadAttention
from .perceiver import PerceiverAttention, PerceiverEncoder
from .pointer import PointerAttention
from .pooling import AttentionPooling, HierarchicalAttention
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from .reformer import LSHAttention, ReformerAttention
from .retnet import RetNetRetention
from .rotary import RotaryEmbedding
from .segment import SegmentAttention, TieredAttention
from .sparse_transformer import SparseTransformerAttention

__all__ = [
    "AdditiveAttention", "AttentionPooling", "BigBirdAttention", "BlockPattern", "BlockSparseAttention",
    "CoAttention", "CoverageAttention", "DeltaNet", "DerivedKeyAttention", "DotProductAttention", "GatedDeltaNet",
    "GatedLinearAttention", "HardAttention", "HierarchicalAttention", "KVCache", "KimiDeltaAttention",
    "LSHAttention", "LambdaLayer", "LearnedPositionalEmbedding", "LinearAttention", "LinformerAttention",
    "LocalAttention", "LongformerAttention", "LuongAttention", "Mamba2Mixer", "MemoryAttention",
    "MultiHeadAttention", "PerceiverAttention", "PerceiverEncoder", "PerformerAttention", "PointerAttention",
    "RecurrentCache", "ReformerAttention", "RetNetRetention", "RotaryEmbedding", "SegmentAttention",
    "SequenceProjection",
    "SinusoidalPositionalEncoding", "SparseTransformerAttention", "TieredAttention", "coverage_loss",
]
