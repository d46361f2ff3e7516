"""Objectives of the structured models: HAN documents, ViT images, pointer sorting, log anomaly detection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .tokens import short_name
from .train import Objective, recorded

__all__ = ["HANObjective", "ImageObjective", "PointerObjective", "AnomalyObjective"]


class HANObjective(Objective):
    """Document classification with a :class:`~attnkit.models.han.HierarchicalAttentionNetwork`."""

    def _out(self, model, batch):
        return model(batch["inputs"], word_mask=batch["word_mask"])

    def loss(self, model, batch, task):
        return F.cross_entropy(self._out(model, batch).logits, batch["targets"])

    def score(self, model, batch, task):
        return task.accuracy(self._out(model, batch).logits.argmax(-1), batch)

    def extra(self, model, batch, task):
        """``han_attention_on_deciding_sentence``: share of documents whose top sentence weight is on the
        deciding sentence; ``word_attention_on_pattern``: share whose top word weight in that sentence is
        one of its two pattern words."""
        out = self._out(model, batch)
        rows = torch.arange(len(batch["targets"]))
        deciding = batch["deciding_sentence"]
        on_sentence = (out.sentence_weights.argmax(-1) == deciding).double().mean().item()
        words = batch["inputs"][rows, deciding]  # (B, W)
        top = words[rows, out.word_weights[rows, deciding].argmax(-1)]  # (B,)
        on_pattern = (top > task.num_neutral).double().mean().item()  # pattern words follow the neutral ids
        return {"han_attention_on_deciding_sentence": on_sentence, "word_attention_on_pattern": on_pattern}

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in range(min(count, len(batch["targets"]))):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            with recorded(model) as rec:
                logits = self._out(model, one).logits
            words, sentences = rec["encoder.word_attention"].weights, rec["encoder.sentence_attention"].weights
            s = task.num_sentences
            ids = one["inputs"][0]
            k_tokens = [" ".join(_word(int(w), task) for w in row if w) for row in ids]
            title = (f"document {i}: label {int(one['targets'][0])}, predicted {int(logits.argmax())}, deciding "
                     f"sentence {int(one['deciding_sentence'][0])}")
            out.append({"title": title,
                        "maps": {"sentence attention": sentences.reshape(1, 1, s),
                                 "word attention": words.reshape(1, s, -1)},
                        "q_tokens": {"sentence attention": ["document"],
                                     "word attention": [f"sentence {j}" for j in range(s)]},
                        "k_tokens": {"sentence attention": k_tokens,
                                     "word attention": [f"w{j}" for j in range(ids.shape[1])]}})
        return out


def _word(i: int, task) -> str:
    if i <= task.num_neutral:
        return f"n{i}"
    signal = i - task.num_neutral - 1
    return f"{'AB'[signal % 2]}{signal // 2}"


class ImageObjective(Objective):
    """Image classification (ViT): cross-entropy, accuracy; maps of every layer on test images."""

    def loss(self, model, batch, task):
        return F.cross_entropy(model(batch["inputs"]), batch["targets"])

    def score(self, model, batch, task):
        return task.accuracy(model(batch["inputs"]).argmax(-1), batch)

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in range(min(count, len(batch["targets"]))):
            with recorded(model) as rec:
                pred = int(model(batch["inputs"][i:i + 1]).argmax())
            maps = {short_name(m.name): m.weights[0] for m in rec if m.weights.dim() == 4}
            n = next(iter(maps.values())).shape[-1] if maps else 0
            side = round((n - 1) ** 0.5)
            tokens = ["cls"] + [f"p{r},{c}" for r in range(side) for c in range(side)]
            title = f"image {i}: label {int(batch['targets'][i])}, predicted {pred}"
            out.append({"title": title, "maps": maps, "q_tokens": tokens[:n], "k_tokens": tokens[:n]})
        return out


class PointerObjective(Objective):
    """Pointer networks: negative log-likelihood of the target pointers; exact match of the greedy decoding."""

    def loss(self, model, batch, task):
        log_probs = model(batch["inputs"], batch["targets"])  # (B, T, n_out)
        return F.nll_loss(log_probs.transpose(1, 2), batch["targets"])

    def score(self, model, batch, task):
        return task.accuracy(model.greedy_decode(batch["inputs"]).ids, batch)

    def extra(self, model, batch, task):
        """``position_accuracy``: share of output positions pointing at the right input."""
        return {"position_accuracy": (model.greedy_decode(batch["inputs"]).ids == batch["targets"]).double().mean()
                .item()}

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in range(min(count, len(batch["targets"]))):
            points = batch["inputs"][i:i + 1]
            ids = model.greedy_decode(points).ids
            with recorded(model) as rec:
                model(points, ids)  # the pointer distributions that produced the decoding
            values = [f"{v:.2f}" for v in points[0, :, 0].tolist()]
            right = bool(torch.equal(ids[0], batch["targets"][i]))
            out.append({"title": f"sorting example {i} ({'right' if right else 'wrong'})",
                        "maps": {"pointer": rec["pointer"].weights[0][None]},
                        "q_tokens": [f"{j + 1}: {values[c]}" for j, c in enumerate(ids[0].tolist())],
                        "k_tokens": values})
        return out


class AnomalyObjective(Objective):
    """Brown et al. 2018: train the event model on normal sessions; score sessions by their worst event."""

    def _nll(self, model, batch):
        events = batch["events"]
        keep = events > 0
        out = model(events, mask=keep)
        keep = keep.clone()
        keep[:, 0] = False  # the user token opens the session: nothing to predict it from
        return out, out.nll.masked_fill(~keep, 0.0), keep

    def loss(self, model, batch, task):
        _, nll, keep = self._nll(model, batch)
        return nll.sum() / keep.sum()

    def score(self, model, batch, task):
        """ROC AUC of the worst-event score against the injected anomalies."""
        _, nll, _ = self._nll(model, batch)
        return task.detection_auc(nll.amax(-1), batch)

    def extra(self, model, batch, task):
        """``anomaly_localized``: share of anomalous sessions whose worst event is the injected one;
        ``attention_on_previous_event``: share whose prediction of that event weighs most the state that
        has just read the event before it (column ``p`` of row ``p``)."""
        out, nll, _ = self._nll(model, batch)
        bad = batch["is_anomaly"]
        pos = batch["anomaly_position"][bad]
        found = (nll[bad].argmax(-1) == pos).double().mean().item()
        result = {"anomaly_localized": found}
        if out.weights is not None:
            rows = out.weights[bad][torch.arange(len(pos)), pos]  # (A, L): the anomalous event's prediction
            result["attention_on_previous_event"] = (rows.argmax(-1) == pos).double().mean().item()
        return result

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in batch["is_anomaly"].nonzero().flatten()[:count].tolist():
            events = batch["events"][i:i + 1]
            length = int(batch["lengths"][i])
            with recorded(model) as rec:
                model(events, mask=events > 0)
            if not len(rec):
                return []
            names = [f"u{int(events[0, 0])}"] + [f"e{int(e) - 1 - task.num_users}" for e in events[0, 1:length]]
            p = int(batch["anomaly_position"][i])
            out.append({"title": f"session {i}: injected anomaly at event {p} ({names[p]})",
                        "maps": {"attention": rec.maps[0].weights[0][:, :length, :length]},
                        "q_tokens": [f"predict {n}" for n in names], "k_tokens": ["start"] + names[:-1]})
        return out
