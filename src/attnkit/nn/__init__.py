"""Attention mechanisms as torch modules (``nn.Module``), one file per family or paper."""

from ..functional.quantize import KVFormat
from ._recurrent import RecurrentCache
from .additive import AdditiveAttention
from .bigbird import BigBirdAttention
from .blocksparse import BlockPattern, BlockSparseAttention
from .coattention import CoAttention
from .comba import Comba
from .coverage import CoverageAttention, coverage_loss
from .delta_product import DeltaProduct
from .deltanet import DeltaNet
from .derived_key import DerivedKeyAttention
from .differential import DifferentialAttention
from .dsa import DSAIndexer, DSALatentAttention, DSASparseAttention
from .forgetting import ForgetCache, ForgettingAttention
from .gated import OutputGate, QKNorm
from .gated_deltanet import GatedDeltaNet
from .gla import GatedLinearAttention
from .hard import HardAttention
from .kimi_delta import KimiDeltaAttention
from .kv_cache import KVCache, LatentCache
from .kv_policies import HeavyHitterCache, KVPolicy, QuestCache, SinkWindowCache, SnapKVCache
from .lambda_layer import LambdaLayer
from .latent import MultiHeadLatentAttention
from .lightning import LightningAttention
from .linear import LinearAttention, PerformerAttention
from .linformer import LinformerAttention, SequenceProjection
from .local import LocalAttention
from .log_linear import LogLinearCache, LogLinearGatedDeltaNet, LogLinearMamba2
from .longformer import LongformerAttention
from .luong import LuongAttention
from .mamba2 import Mamba2Mixer
from .memory import MemoryAttention
from .moba import MoBA
from .multihead import DotProductAttention, MultiHeadAttention
from .nsa import NativeSparseAttention
from .paged_kv_cache import PagedBatch, PagedKVCache
from .path import PaTHAttention, PathCache
from .perceiver import PerceiverAttention, PerceiverEncoder
from .pointer import PointerAttention
from .pooling import AttentionPooling, HierarchicalAttention
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from .prefix_cache import PrefixCache
from .reformer import LSHAttention, ReformerAttention
from .retnet import RetNetRetention
from .rope_scaling import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    ProportionalScaling,
    YarnScaling,
)
from .rotary import RotaryEmbedding
from .rwkv import RWKV4TimeMixing
from .rwkv7 import RWKV7TimeMixing
from .segment import SegmentAttention, TieredAttention
from .sparse_transformer import SparseTransformerAttention

__all__ = [
    "AdditiveAttention", "AttentionPooling", "BigBirdAttention", "BlockPattern", "BlockSparseAttention",
    "CoAttention", "Comba", "CoverageAttention", "DSAIndexer", "DSALatentAttention", "DSASparseAttention",
    "DeltaNet",
    "DeltaProduct", "DerivedKeyAttention",
    "DifferentialAttention", "DotProductAttention", "DynamicNTKScaling", "ForgetCache", "ForgettingAttention",
    "GatedDeltaNet", "GatedLinearAttention",
    "HardAttention", "HeavyHitterCache", "HierarchicalAttention", "KVCache", "KVFormat", "KVPolicy",
    "KimiDeltaAttention",
    "LSHAttention", "LambdaLayer", "LatentCache", "LearnedPositionalEmbedding", "LightningAttention",
    "LinearAttention", "LinearScaling", "LinformerAttention", "LogLinearCache", "LogLinearGatedDeltaNet",
    "LogLinearMamba2",
    "Llama3Scaling", "LocalAttention", "LongRopeScaling", "LongformerAttention", "LuongAttention", "Mamba2Mixer",
    "MemoryAttention", "MoBA", "MultiHeadAttention", "MultiHeadLatentAttention", "NativeSparseAttention",
    "OutputGate", "PaTHAttention", "PagedBatch", "PagedKVCache", "PathCache", "PerceiverAttention",
    "PerceiverEncoder",
    "PerformerAttention", "PointerAttention", "PrefixCache", "ProportionalScaling",
    "QKNorm", "QuestCache", "RWKV4TimeMixing", "RWKV7TimeMixing", "RecurrentCache", "ReformerAttention",
    "RetNetRetention", "RotaryEmbedding",
    "SegmentAttention", "SinkWindowCache", "SnapKVCache",
    "SequenceProjection", "SinusoidalPositionalEncoding", "SparseTransformerAttention", "TieredAttention",
    "YarnScaling", "coverage_loss",
]
