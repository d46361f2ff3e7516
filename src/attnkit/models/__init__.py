"""Models built from attnkit attention: the Transformer family, Vision Transformer, Perceiver, the RNN
encoder-decoder with any attention, pointer networks, the hierarchical attention network and the
attention-based log anomaly detector."""

from .blocks import TransformerDecoderLayer, TransformerEncoderLayer
from .han import HierarchicalAttentionNetwork
from .language_model import TransformerLM
from .log_anomaly import LogAnomalyDetector
from .perceiver import Perceiver
from .pointer_generator import PointerGenerator
from .pointer_network import PointerNetwork
from .self_attention import SoftmaxSelfAttention
from .seq2seq import Seq2Seq
from .stacks import TransformerDecoder, TransformerEncoder
from .transformer import Transformer
from .vit import VisionTransformer

__all__ = [
    "HierarchicalAttentionNetwork", "LogAnomalyDetector", "Perceiver", "PointerGenerator", "PointerNetwork",
    "Seq2Seq", "SoftmaxSelfAttention", "Transformer", "TransformerDecoder", "TransformerDecoderLayer",
    "TransformerEncoder", "TransformerEncoderLayer", "TransformerLM", "VisionTransformer",
]
