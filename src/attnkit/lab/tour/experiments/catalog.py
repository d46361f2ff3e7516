"""The tour's experiments: sizes, budgets and descriptions, and the default and quick sets.

Budgets were tuned so each run is meaningful at its cost on one CPU thread: MQAR's 2-layer
softmax Transformer leaves its plateau (guessing among the values in context, ~33 %) by step
~200 of 300 for each of seeds 0-5, dates reach >= 98 % exact match in 300 steps with
attention, and the HAN, ViT, pointer and anomaly models converge in a few hundred steps
(HAN at 120 steps and the event-log models at 150 fell to 96-97 %). The classic modules'
experiments (:data:`CLASSIC`) were set on seeds 0-2: hard and soft attention reach 100 % in
200 steps, the memory LM in 120 (the plain LSTM stays near 32 %), the question readers are
given 300 steps (co-attention is the slowest, 70-96 %), and the summaries plateau by step ~100
of the 200. Measured on a quiet 2-core machine: 2 to 18 s a run; the first 15 experiments x 3
seeds plus the scaling measurement took about 8.5 minutes, the classic ones add an estimated
1.5 (they were timed on a busy machine).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from ....models import VisionTransformer
from ....models.han import HierarchicalAttentionNetwork
from ....models.log_anomaly import LogAnomalyDetector
from ....models.pointer_generator import PointerGenerator
from ....models.pointer_network import PointerNetwork
from ... import tasks
from . import Built, Experiment
from .classic import HardObjective, MemoryLM, MemoryObjective, OnePositionClassifier, QuestionModel, QuestionObjective
from .coverage import SummaryObjective
from .mad import mad_experiments
from .modern import experiments as _modern_experiments
from .positions import position_experiments
from .recall import KEYS as RECALL_KEYS
from .recall import recall_experiments
from .recurrences import recurrence_experiments
from .seq2seq import NoAttention, Seq2SeqObjective, seq2seq_model
from .sinks import SinkObjective, with_sinks
from .state import state_experiments
from .structured import AnomalyObjective, HANObjective, ImageObjective, PointerObjective
from .tokens import CopyObjective, language_model
from .train import Budget
from .variants import variant_experiments

__all__ = ["catalog", "DEFAULT", "QUICK", "CLASSIC", "MQAR", "WINDOW", "USES"]

MQAR = {"num_pairs": 4, "num_keys": 16, "num_values": 16, "gap": 8}
WINDOW = 4  # each query sees 4 tokens back; two layers reach 2 x 4 = 8 = gap positions: still no pair token


def _mqar(attention: str = "softmax", layers: int = 2, window: int | None = None, sinks: bool = False) -> Built:
    task = tasks.get("mqar", **MQAR)
    model = language_model(task, attention, layers=layers, window=window)
    return Built(with_sinks(model) if sinks else model, task, task, SinkObjective())


def _mqar_experiments() -> list[Experiment]:
    budget, quick = Budget(steps=300, lr=3e-3), Budget(steps=200, lr=3e-3)
    length = 2 * MQAR["num_pairs"] + MQAR["gap"] + MQAR["num_pairs"]
    sizes = (("batch", 64), ("heads", 2), ("head_dim", 32), ("dim", 64), ("q_len", length), ("kv_len", length),
             ("length", length), ("causal", True), ("window", WINDOW))
    spec = [
        ("softmax-2layer", "2-layer softmax Transformer: layer 1 copies each key into its value, layer 2 matches",
         partial(_mqar), "scaled-dot-product"),
        ("softmax-1layer", "1-layer softmax Transformer: one layer cannot bind a value to its key",
         partial(_mqar, layers=1), "scaled-dot-product"),
        ("softmax-sinks", "2-layer softmax Transformer with a learned sink per head (gpt-oss): less weight "
         "on the first token (first_token_mass)", partial(_mqar, sinks=True), "attention-sinks"),
        ("linear", "2-layer linear attention (Katharopoulos et al. 2020): a fixed-size state, no sharp lookup",
         partial(_mqar, "linear-attention"), "linear-attention"),
        ("sliding-window", f"2-layer softmax, causal window of {WINDOW}: every pair lies beyond its reach",
         partial(_mqar, window=WINDOW), "sliding-window"),
        ("performer", "2-layer Performer (FAVOR+ random features, Choromanski et al. 2021)",
         partial(_mqar, "performer"), "performer"),
    ]
    head = f"MQAR ({MQAR['num_pairs']} pairs of {MQAR['num_keys']} keys, gap {MQAR['gap']}, causal, pre-norm)"
    return [Experiment("mqar", mech, f"{head}: {text}", build, budget, quick, cost, sizes)
            for mech, text, build, cost in spec]


def _dates(attention) -> Built:
    task = tasks.get("dates")
    return Built(seq2seq_model(task, attention), task, task, Seq2SeqObjective())


def _dates_experiments() -> list[Experiment]:
    budget, quick = Budget(steps=300, lr=5e-3), Budget(steps=250, lr=5e-3)
    spec = [("additive", "Bahdanau additive attention", "additive", "additive"),
            ("luong-general", "Luong general (bilinear) attention", "luong-general", "luong"),
            ("none", "no attention: the source reaches the decoder only through the encoder's final state",
             NoAttention, None)]
    src = tasks.get("dates").source_len
    sizes = (("batch", 64), ("q_len", 12), ("kv_len", src), ("query_dim", 64), ("key_dim", 64), ("hidden_dim", 64),
             ("score", "general"), ("mode", "global"))
    return [Experiment("dates", mech, f"dates to ISO 8601, GRU encoder-decoder: {text}", partial(_dates, attn),
                       budget, quick, cost, sizes if cost else ()) for mech, text, attn, cost in spec]


def _han() -> Built:
    task = tasks.get("han_documents")
    model = HierarchicalAttentionNetwork(task.vocab_size, task.num_classes, embed_dim=32, hidden_dim=32, padding_idx=0)
    return Built(model, task, task, HANObjective())


def _vit() -> Built:
    task = tasks.get("shapes")
    model = VisionTransformer(task.size, 4, in_channels=1, num_classes=task.num_classes, dim=32, depth=2,
                              num_heads=2)
    return Built(model, task, task, ImageObjective())


def _sorting() -> Built:
    task = tasks.get("sorting", num_points=6)
    return Built(PointerNetwork(1, 64), task, task, PointerObjective())


def _event_logs(variant: str) -> Built:
    task = tasks.get("event_logs")
    model = LogAnomalyDetector(task.vocab_size, embed_dim=16, hidden_dim=32, attention=variant)
    return Built(model, task, task.test_task(), AnomalyObjective())


def _copy(attention: str) -> Built:
    task = tasks.get("selective_copy", num_tokens=4, context_len=16, data_vocab=8)
    return Built(language_model(task, attention), task, task, CopyObjective())


def _copy_experiments() -> list[Experiment]:
    budget, quick = Budget(steps=300, lr=3e-3), Budget(steps=200, lr=3e-3)
    sizes = (("batch", 64), ("heads", 2), ("head_dim", 32), ("dim", 64), ("q_len", 20), ("kv_len", 20),
             ("length", 20), ("causal", True), ("stride", 8), ("summary", 1))
    spec = [("softmax", "softmax attention", "softmax", "scaled-dot-product"),
            ("sparse-fixed", "Sparse Transformer 'fixed' pattern (own block of 8 + each block's last position, "
             "Child et al. 2019) on the block-sparse kernel", "block-sparse", "sparse-fixed"),
            ("sparse-strided", "Sparse Transformer 'strided' pattern (8 back + every 8th position)",
             "sparse-transformer", "sparse-transformer"),
            ("linear", "linear attention (Katharopoulos et al. 2020)", "linear-attention", "linear-attention")]
    head = "selective copy (4 data tokens among 16 positions), 2-layer causal pre-norm Transformer"
    return [Experiment("selective_copy", mech, f"{head}: {text}", partial(_copy, attn), budget, quick, cost, sizes)
            for mech, text, attn, cost in spec]


def _model_experiments() -> list[Experiment]:
    logs = ("event logs, anomaly score = worst event NLL (ROC AUC), Brown et al. 2018 LSTM; the LSTM alone carries "
            "the user's role through these sessions, so both detect nearly every anomaly")
    return [
        Experiment("han_documents", "han", "hierarchical attention network: word attention, then sentence attention",
                   _han, Budget(steps=200, lr=3e-3), Budget(steps=100, lr=3e-3), "additive"),
        Experiment("shapes", "vit", "Vision Transformer on 16x16 shapes: 4x4 patches, 2 layers, 2 heads", _vit,
                   Budget(steps=200, lr=3e-3), Budget(steps=100, lr=3e-3), "scaled-dot-product",
                   (("batch", 64), ("heads", 2), ("head_dim", 16), ("q_len", 17), ("kv_len", 17))),
        Experiment("sorting", "pointer", "pointer network sorting 6 numbers (the attention is the output)",
                   _sorting, Budget(steps=600, lr=3e-3), Budget(steps=300, lr=3e-3), "additive"),
        Experiment("event_logs", "semantic", f"{logs} with semantic attention over its past states",
                   partial(_event_logs, "semantic"), Budget(steps=300, lr=5e-3), Budget(steps=150, lr=5e-3)),
        Experiment("event_logs", "none", f"{logs} without attention (the paper's baseline)",
                   partial(_event_logs, "none"), Budget(steps=300, lr=5e-3), Budget(steps=150, lr=5e-3)),
    ]


def _deciding(mode: str) -> Built:
    task = tasks.get("deciding_position")
    return Built(OnePositionClassifier(task.vocab_size, task.num_classes, mode=mode), task, task, HardObjective())


def _repeated(memory_size: int | None) -> Built:
    task = tasks.get("repeated_block")
    return Built(MemoryLM(task.vocab_size, memory_size=memory_size), task, task, MemoryObjective())


def _questions(reader: str) -> Built:
    task = tasks.get("document_questions")
    return Built(QuestionModel(task.vocab_size, task.num_classes, reader=reader), task, task, QuestionObjective())


def _summaries(coverage: bool) -> Built:
    task = tasks.get("key_summaries")
    model = PointerGenerator(task.vocab_size, embed_dim=32, hidden_dim=64, coverage=coverage)
    return Built(model, task, task, SummaryObjective(coverage_weight=1.0 if coverage else 0.0))


def _classic_experiments() -> list[Experiment]:
    hard = "one marked token among 16 decides the label; a learned query attends once (Xu et al. 2015)"
    period = tasks.get("repeated_block").period
    lm = f"LSTM language model on a repeated block of {period} tokens (the next token is {period} back)"
    qa = "question over a document of 6 subject-value segments, bidirectional-GRU encoder"
    b, q = Budget(steps=300, lr=3e-3), Budget(steps=150, lr=3e-3)
    one, one_q = Budget(steps=200, lr=3e-3), Budget(steps=100, lr=3e-3)  # both pick the position by step ~100
    pg_b, pg_q = Budget(steps=200, lr=3e-3), Budget(steps=100, lr=3e-3)  # both plateau by step ~100
    lm_b, lm_q = Budget(steps=120, lr=3e-3), Budget(steps=80, lr=3e-3)  # memory solves it by step ~60
    pg = "pointer-generator summaries listing a document's 5 key words once (2 are mentioned twice)"
    return [
        Experiment("key_summaries", "pointer-generator", f"{pg}: no coverage (See et al. 2017's baseline)",
                   partial(_summaries, False), pg_b, pg_q, "additive"),
        Experiment("key_summaries", "coverage", f"{pg}: with coverage in the scores and the coverage loss "
                   "(eqs. 11-13); coverage is per position, and a key's second mention sits at a new one",
                   partial(_summaries, True), pg_b, pg_q, "coverage-attention"),
        Experiment("deciding_position", "soft", f"{hard}: soft attention (deterministic, backpropagation)",
                   partial(_deciding, "soft"), one, one_q, "additive"),
        Experiment("deciding_position", "hard-reinforce", f"{hard}: stochastic hard attention trained with "
                   "REINFORCE (batch-mean baseline), the most likely location at test",
                   partial(_deciding, "stochastic"), one, one_q, "additive"),
        Experiment("repeated_block", "lstm", f"{lm}: no memory, the LSTM state must carry the block",
                   partial(_repeated, None), lm_b, lm_q),
        Experiment("repeated_block", "memory-8", f"{lm}: random access memory over the last 8 states "
                   "(Yogatama et al. 2018): the needed state is inside", partial(_repeated, 8), lm_b, lm_q),
        Experiment("document_questions", "segment", f"{qa}: the question attends over mean-pooled segments",
                   partial(_questions, "segment"), b, q),
        Experiment("document_questions", "co-attention", f"{qa}: parallel co-attention of question words and "
                   "document tokens (Lu et al. 2016)", partial(_questions, "co-attention"), b, q),
        Experiment("document_questions", "none", f"{qa}: no attention, the document's mean state",
                   partial(_questions, "none"), b, q),
    ]


_TOKENS = ("multi-head", "sinusoidal-positional-encoding", "causal")  # the causal pre-norm Transformer LM
USES = {  # experiment key -> the registry entries its model exercises (attnkit.lab.tour.catalogue checks them)
    "mqar/softmax-2layer": (*_TOKENS, "scaled-dot-product"), "mqar/softmax-1layer": (*_TOKENS, "scaled-dot-product"),
    "mqar/softmax-sinks": (*_TOKENS, "scaled-dot-product", "attention-sinks"),
    "mqar/linear": (*_TOKENS[1:], "linear-attention"), "mqar/sliding-window": (*_TOKENS, "sliding-window"),
    "mqar/performer": (*_TOKENS[1:], "performer"),
    "dates/additive": ("additive",), "dates/luong-general": ("luong",), "dates/none": (),
    "selective_copy/softmax": (*_TOKENS, "scaled-dot-product"),
    "selective_copy/sparse-fixed": (*_TOKENS[1:], "block-sparse", "sparse-fixed"),
    "selective_copy/sparse-strided": (*_TOKENS[1:], "sparse-transformer", "sparse-strided"),
    "selective_copy/linear": (*_TOKENS[1:], "linear-attention"),
    "han_documents/han": ("hierarchical-attention", "attention-pooling"), "shapes/vit": ("multi-head",),
    "sorting/pointer": ("pointer",), "event_logs/semantic": ("derived-key",), "event_logs/none": (),
    "key_summaries/pointer-generator": ("additive",), "key_summaries/coverage": ("coverage-attention",),
    "deciding_position/soft": ("hard-attention",), "deciding_position/hard-reinforce": ("hard-attention",),
    "repeated_block/lstm": (), "repeated_block/memory-8": ("memory-attention",),
    "document_questions/segment": ("segment-attention",), "document_questions/co-attention": ("co-attention-parallel",),
    "document_questions/none": (),
}


def catalog() -> list[Experiment]:
    """Every experiment, in tour order; those of this file with the registry entries they use (:data:`USES`),
    the others (recall against state size, recent models' attention) name their own."""
    exps = [*_mqar_experiments(), *_dates_experiments(), *_copy_experiments(), *_model_experiments(),
            *_classic_experiments(), *recall_experiments(), *_modern_experiments(),
            *state_experiments(), *mad_experiments(), *variant_experiments(),
            *position_experiments(), *recurrence_experiments()]
    return [replace(e, uses=USES[e.key]) if e.key in USES else e for e in exps]


CLASSIC = ("key_summaries/pointer-generator", "key_summaries/coverage", "deciding_position/soft",
           "deciding_position/hard-reinforce", "repeated_block/lstm", "repeated_block/memory-8",
           "document_questions/segment", "document_questions/co-attention", "document_questions/none")
DEFAULT = ("mqar/softmax-2layer", "mqar/softmax-1layer", "mqar/softmax-sinks", "mqar/linear", "mqar/sliding-window",
           "mqar/performer",
           "dates/additive", "dates/luong-general", "dates/none", "selective_copy/softmax",
           "selective_copy/sparse-fixed", "han_documents/han", "shapes/vit",
           "sorting/pointer", "event_logs/semantic", "event_logs/none", *CLASSIC, *RECALL_KEYS)
QUICK = ("mqar/softmax-2layer", "mqar/softmax-1layer", "mqar/sliding-window", "dates/additive",
         "han_documents/han", "shapes/vit", "sorting/pointer", "event_logs/semantic",
         "deciding_position/hard-reinforce", "repeated_block/memory-8", "document_questions/segment")
