"""A small decoder-only transformer in numpy, built for a decode loop that batches.

GPT-2's shape (learned positions, pre-norm blocks, GELU, output head tied to the token
embedding, with an optional ``lm_head.bias``), float32. State lives in *slots*: each slot has
its own KV cache rows for every layer (``[slots, heads, context, head_dim]``) and a length.
``step`` runs, in one pass, one token for each of several slots (decoding) and prompt chunks
into other slots (prefilling: a whole prompt, or a piece of one at an offset into the slot's
cache, so a long prompt can be spread over several steps). All those rows go through each
layer together: one product per weight over all of them, one scatter of their keys and values
into their slots' caches, then each row attends to its own slot's cache up to its own
position; the masks, positions and LoRA row groups are laid out once per step, not per layer.
It returns one row of logits per decoding slot and one per chunk (its last position). The
decoding rows' attention reads the cache through views (no copy, no gather), one of two ways
chosen per step: over the slot range in one batched product, every row padded to the longest
row's width (slots of the range not in the batch cost a few wasted multiplications), or row
by row, each over its own slot up to its own position, when the padding would read much
more of the cache than the rows need (mixed lengths: the reads, which come from memory, are
what the step pays for); a chunk's reads its own slot's cache (a view), with its causal
mask.
Attention stays per kind because it is per slot: padding every slot's queries to the longest
chunk, to run decode rows and chunks in one batched product, costs more than it saves.
``prefill`` and ``decode`` are the two halves alone.

LoRA adapters apply per row on the shared base weights: for the rows of the batch that ask
for adapter ``a``, ``x @ A.T @ B.T * scale`` is added to the base projection; the base
weights are never copied or merged.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nursery.llm.weights import Adapter, WeightsError, load_safetensors

LINEARS = ("attn.qkv", "attn.out", "mlp.up", "mlp.down")


@dataclass(frozen=True)
class DecoderConfig:
    """``config.json`` beside the weights (Hugging Face's key names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    bos_token_id: int
    eos_token_id: int
    layer_norm_epsilon: float = 1e-5

    @classmethod
    def from_file(cls, path: str | Path) -> DecoderConfig:
        try:
            raw = json.loads(Path(path).read_text())
            return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        except (OSError, ValueError, TypeError) as exc:
            raise WeightsError(f"cannot read {path}: {exc!r}") from exc

    def as_json(self) -> dict[str, object]:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {"model_type": "nursery-tiny-decoder", **fields}


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdims=True)
    return centered / np.sqrt(var + eps) * w + b  # type: ignore[no-any-return]


def _gelu(x: np.ndarray) -> np.ndarray:
    """``0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))``, the same
    operations in the same order, in two buffers instead of seven."""
    t = 0.044715 * x
    t *= x
    t *= x
    t += x
    t *= 0.7978845608
    np.tanh(t, out=t)
    t += 1.0
    y = 0.5 * x
    y *= t
    return y


def _softmax(scores: np.ndarray) -> None:
    """Softmax over the last axis, in place."""
    scores -= scores.max(-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(-1, keepdims=True)


# padding (cache positions per decode row) past which a step's decode rows attend row by row
RAGGED_ROWS = 16


@dataclass(frozen=True)
class _Span:
    """The decode rows' attention, built once per step (``Decoder._span``): the slot range
    ``lo .. hi`` and the widest row's ``width``; ``rows``: ``(slot, positions)`` of each row
    when they attend row by row (None: over the span together); ``where``: each row's place
    in the span; ``mask``: per span slot (or per row), the positions it may not see;
    ``buffer``: the span's queries, or the rows' scores."""

    lo: int
    hi: int
    width: int
    where: np.ndarray
    mask: np.ndarray
    buffer: np.ndarray
    rows: list[tuple[int, int]] | None


@dataclass(frozen=True)
class _Rows:
    """One step's rows, laid out once for all layers: the decode rows (``batch`` of them)
    first, then each chunk's. ``lora``: for each adapter in use, its rows; ``chunks``:
    ``(first row, rows, slot, start, causal mask)``; ``last``: the rows whose logits the
    step returns (every decode row, each chunk's last)."""

    batch: int
    tokens: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    lora: list[tuple[int, np.ndarray]]
    span: _Span | None
    chunks: list[tuple[int, int, int, int, np.ndarray]]
    last: np.ndarray


class Decoder:
    def __init__(self, config: DecoderConfig, weights: dict[str, np.ndarray], slots: int,
                 adapters: Sequence[Adapter] = ()) -> None:
        self.config = config
        c = config
        self.heads = c.num_attention_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.n_ctx = c.max_position_embeddings
        self.slots = slots

        def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
            array = weights.get(name)
            if array is None or array.shape != shape:
                found = None if array is None else array.shape
                raise WeightsError(f"weight {name!r}: expected shape {shape}, found {found}")
            return np.ascontiguousarray(array, dtype=np.float32)

        d, f = c.hidden_size, c.intermediate_size
        self.embed = get("embed.weight", (c.vocab_size, d))
        self.embed_t = np.ascontiguousarray(self.embed.T)
        self.pos = get("pos.weight", (self.n_ctx, d))
        shapes = {"attn.qkv": (3 * d, d), "attn.out": (d, d), "mlp.up": (f, d), "mlp.down": (d, f)}
        self.layers: list[dict[str, np.ndarray]] = []
        for i in range(c.num_hidden_layers):
            layer = {n: np.ascontiguousarray(get(f"layers.{i}.{n}.weight", shapes[n]).T)
                     for n in LINEARS}  # stored [out, in] as torch does; used as x @ W
            for norm in ("ln1", "ln2"):
                layer[f"{norm}.w"] = get(f"layers.{i}.{norm}.weight", (d,))
                layer[f"{norm}.b"] = get(f"layers.{i}.{norm}.bias", (d,))
            self.layers.append(layer)
        self.ln_f = (get("ln_f.weight", (d,)), get("ln_f.bias", (d,)))
        self.head_bias = get("lm_head.bias", (c.vocab_size,)) if "lm_head.bias" in weights \
            else None
        # adapter 0 is "none"; for each adapter: {(layer, module): (A.T * scale, B.T)}
        self.adapter_names = [""]
        self._lora: list[dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]] = [{}]
        for adapter in adapters:
            self.adapter_names.append(adapter.name)
            table = {}
            for module, (a, b) in adapter.modules.items():
                layer_no, _, name = module.removeprefix("layers.").partition(".")
                if not layer_no.isdigit() or int(layer_no) >= len(self.layers) \
                        or name not in shapes:
                    raise WeightsError(f"LoRA '{adapter.name}': no module {module!r} in the model")
                out_dim, in_dim = shapes[name]
                if a.shape[1] != in_dim or b.shape[0] != out_dim:
                    raise WeightsError(f"LoRA '{adapter.name}': {module} has shapes {a.shape}, "
                                       f"{b.shape}; the model's is [{out_dim}, {in_dim}]")
                table[(int(layer_no), name)] = (
                    np.ascontiguousarray(a.T * np.float32(adapter.scale)),
                    np.ascontiguousarray(b.T))
            self._lora.append(table)
        shape = (slots, self.heads, self.n_ctx, self.head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in self.layers]
        self.v = [np.zeros(shape, np.float32) for _ in self.layers]
        self.lengths = np.zeros(slots, np.int64)
        self._scale = np.float32(1.0 / np.sqrt(self.head_dim))
        self.ragged_rows = RAGGED_ROWS

    # -- the entry points -------------------------------------------------------------------

    def step(self, slots: Sequence[int], tokens: Sequence[int], adapters: Sequence[int] | None,
             prefills: Sequence[tuple[int, Sequence[int], int, int]] = ()
             ) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass for a decode loop's step: one token for each of ``slots`` (their
        next position) and, in the same pass, prompt chunks ``(slot, ids, adapter, start)``
        run into their slots at positions ``start ..`` (``start`` 0: the slot's cache starts
        over; otherwise it must be the slot's length, the chunks of a prompt following each
        other). A slot appears once per step. Returns the logits of the decode rows
        ``[len(slots), vocab]`` and of each chunk's last position ``[len(prefills), vocab]``.

        All the step's rows (decode rows first, then each chunk's) go through each layer
        together: one product per weight over all of them, one scatter of their keys and
        values into their slots' caches at their positions; then each row attends to its own
        slot's cache up to its own position (the decode rows in one batched product over the
        span of their slots or row by row, each chunk over its slot's cache with its causal
        mask)."""
        rows = self._rows(slots, tokens, adapters, prefills)
        count, eps = len(rows.tokens), self.config.layer_norm_epsilon
        x = self.embed[rows.tokens] + self.pos[rows.positions]
        att = np.empty((count, self.heads, self.head_dim), np.float32)  # every layer's
        flat = att.reshape(count, self.config.hidden_size)
        for i, layer in enumerate(self.layers):
            h = _layer_norm(x, layer["ln1.w"], layer["ln1.b"], eps)
            qkv = self._linear(h, i, "attn.qkv", rows.lora).reshape(
                count, 3, self.heads, self.head_dim)
            self.k[i][rows.slots, :, rows.positions] = qkv[:, 1]
            self.v[i][rows.slots, :, rows.positions] = qkv[:, 2]
            self._attend(i, qkv[:, 0], rows, att)
            x += self._linear(flat, i, "attn.out", rows.lora)
            x += self._mlp(x, i, layer, rows.lora)
        # each slot's last row (a decode row, a chunk's last) gives its new length
        self.lengths[rows.slots[rows.last]] = rows.positions[rows.last] + 1
        logits = self._logits(x[rows.last])
        return logits[:rows.batch], logits[rows.batch:]

    def prefill(self, slot: int, ids: Sequence[int], adapter: int = 0, start: int = 0
                ) -> np.ndarray:
        """Run a prompt into ``slot`` (its cache starts over), or with ``start`` a further
        chunk of one; the last position's logits."""
        last: np.ndarray = self.step((), (), None, [(slot, ids, adapter, start)])[1][0]
        return last

    def decode(self, slots: Sequence[int], tokens: Sequence[int],
               adapters: Sequence[int] | None = None) -> np.ndarray:
        """One step for several slots: feed each its token, return ``[len(slots), vocab]``."""
        return self.step(slots, tokens, adapters)[0]

    # -- one step's rows --------------------------------------------------------------------

    def _rows(self, slots: Sequence[int], tokens: Sequence[int],
              adapters: Sequence[int] | None,
              prefills: Sequence[tuple[int, Sequence[int], int, int]]) -> _Rows:
        """Check a step and lay out its rows, masks and adapter groups, once for all layers."""
        slot_ix = np.asarray(slots, dtype=np.int64)
        batch = len(slot_ix)
        positions = self.lengths[slot_ix]
        if batch and (positions >= self.n_ctx).any():
            raise ValueError("a sequence has filled the model's context")
        for slot, ids, _, start in prefills:
            if not len(ids) or start + len(ids) > self.n_ctx:
                raise ValueError(f"a prompt of {start + len(ids)} tokens does not fit a context "
                                 f"of {self.n_ctx}")
            if start and start != self.lengths[slot]:
                raise ValueError(f"a prompt chunk at {start} does not follow the "
                                 f"{self.lengths[slot]} tokens of slot {slot}")
        chunk_slots = [slot for slot, _, _, _ in prefills]
        if len({*slots, *chunk_slots}) != batch + len(chunk_slots):
            raise ValueError("a slot appears twice in one step")
        lengths = [len(ids) for _, ids, _, _ in prefills]
        token_rows = np.concatenate([np.asarray(tokens, np.int64),
                                     *(np.asarray(ids, np.int64) for _, ids, _, _ in prefills)])
        pos_rows = np.concatenate([positions, *(np.arange(start, start + n) for (_, _, _, start), n
                                                in zip(prefills, lengths, strict=True))])
        slot_rows = np.concatenate([slot_ix, *(np.full(n, slot, np.int64) for slot, n
                                               in zip(chunk_slots, lengths, strict=True))])
        adapter_rows = np.concatenate([
            np.zeros(batch, np.int64) if adapters is None else np.asarray(adapters, np.int64),
            *(np.full(n, a, np.int64) for (_, _, a, _), n in zip(prefills, lengths,
                                                                  strict=True))])
        lora = [(int(a), np.flatnonzero(adapter_rows == a))
                for a in np.unique(adapter_rows[adapter_rows > 0])]
        chunks, first = [], batch
        for (slot, _, _, start), n in zip(prefills, lengths, strict=True):
            causal = np.triu(np.full((n, start + n), -np.inf, np.float32), start + 1)
            chunks.append((first, n, slot, start, causal))
            first += n
        last = np.concatenate([np.arange(batch), batch + np.cumsum(lengths, dtype=np.int64) - 1])
        return _Rows(batch, token_rows, pos_rows, slot_rows, lora,
                     self._span(slot_ix, positions) if batch else None, chunks, last)

    # -- attention --------------------------------------------------------------------------

    def _span(self, slot_ix: np.ndarray, positions: np.ndarray) -> _Span:
        """What the decode rows' attention reads, built once per step. Two ways, whichever
        reads less of the cache: the *span* (one batched product over the slot range, each
        row padded to the longest row's width: few calls, but every row reads the longest
        row's keys) or *rows* (a product per row over its own slot up to its own position:
        a call per row and layer, no padding). With mixed lengths the cache reads, not the
        calls, are the cost of a decode step's attention (they come from memory, not from
        the processor's caches), so ``rows`` is taken when the padding would read more than
        ``ragged_rows`` (``RAGGED_ROWS``) positions per row beyond what the rows need."""
        lo, hi = int(slot_ix.min()), int(slot_ix.max()) + 1
        width = int(positions.max()) + 1
        ragged = (hi - lo) * width - (int(positions.sum()) + len(slot_ix)) \
            > self.ragged_rows * len(slot_ix)
        if ragged:
            limit, where = positions, np.arange(len(slot_ix))
            buffer = np.zeros((len(slot_ix), self.heads, 1, width), np.float32)  # scores
        else:
            where = slot_ix - lo
            # per slot of the span: how far it may look (slots not in the batch: 0)
            limit = np.zeros(hi - lo, np.int64)
            limit[where] = positions
            buffer = np.zeros((hi - lo, self.heads, 1, self.head_dim), np.float32)  # queries
        mask = np.where(np.arange(width)[None, :] > limit[:, None], -np.inf, 0.0
                        ).astype(np.float32)[:, None, None, :]
        return _Span(lo, hi, width, where, mask, buffer,
                     [(int(s), int(n) + 1) for s, n in zip(slot_ix, positions, strict=True)]
                     if ragged else None)

    def _attend(self, i: int, q: np.ndarray, rows: _Rows, out: np.ndarray) -> None:
        """Layer ``i``'s attention for every row (``q``: ``[rows, H, hd]``; the rows' keys and
        values are in the cache already) into ``out``: each row over its own slot's cache up
        to its own position."""
        span = rows.span
        if span is not None and span.rows is not None:  # a product per row, its own width
            scores, k, v = span.buffer, self.k[i], self.v[i]
            for r, (slot, n) in enumerate(span.rows):
                np.matmul(q[r, :, None, :], k[slot, :, :n].transpose(0, 2, 1),
                          out=scores[r, :, :, :n])
            scores *= self._scale
            scores += span.mask  # what a row did not compute is masked out
            _softmax(scores)
            for r, (slot, n) in enumerate(span.rows):
                np.matmul(scores[r, :, :, :n], v[slot, :, :n], out=out[r, :, None, :])
        elif span is not None:
            q_span = span.buffer
            q_span[span.where, :, 0] = q[:rows.batch]
            keys = self.k[i][span.lo:span.hi, :, :span.width]  # views: [span, H, width, hd]
            values = self.v[i][span.lo:span.hi, :, :span.width]
            scores = np.matmul(q_span, keys.transpose(0, 1, 3, 2))
            scores *= self._scale
            scores += span.mask
            _softmax(scores)
            out[:rows.batch] = np.matmul(scores, values)[span.where, :, 0]
        for first, n, slot, start, causal in rows.chunks:
            # a chunk at positions start .. start + n: each position attends to every one
            # before it, of earlier chunks and its own (causally)
            keys = self.k[i][slot, :, :start + n]  # views: [H, start + n, hd]
            values = self.v[i][slot, :, :start + n]
            scores = np.matmul(q[first:first + n].transpose(1, 0, 2), keys.transpose(0, 2, 1))
            scores *= self._scale
            scores += causal
            _softmax(scores)
            out[first:first + n] = np.matmul(scores, values).transpose(1, 0, 2)

    # -- pieces -----------------------------------------------------------------------------

    def _linear(self, x: np.ndarray, layer: int, name: str,
                lora: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
        """``x @ W`` and, for each adapter's rows, its low-rank update."""
        y: np.ndarray = x @ self.layers[layer][name]
        for adapter, pick in lora:
            pair = self._lora[adapter].get((layer, name))
            if pair is not None:
                y[pick] += (x[pick] @ pair[0]) @ pair[1]
        return y

    def _mlp(self, x: np.ndarray, i: int, layer: dict[str, np.ndarray],
             lora: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
        h = _layer_norm(x, layer["ln2.w"], layer["ln2.b"], self.config.layer_norm_epsilon)
        return self._linear(_gelu(self._linear(h, i, "mlp.up", lora)), i, "mlp.down", lora)

    def _logits(self, x: np.ndarray) -> np.ndarray:
        h = _layer_norm(x, self.ln_f[0], self.ln_f[1], self.config.layer_norm_epsilon)
        logits: np.ndarray = h @ self.embed_t
        if self.head_bias is not None:
            logits += self.head_bias
        return logits

    def adapter_index(self, name: str) -> int | None:
        try:
            return self.adapter_names.index(name)
        except ValueError:
            return None


def load_decoder(folder: str | Path, slots: int, adapters: Sequence[Adapter] = ()) -> Decoder:
    """``config.json`` and ``model.safetensors`` from ``folder``."""
    folder = Path(folder)
    return Decoder(DecoderConfig.from_file(folder / "config.json"),
                   load_safetensors(folder / "model.safetensors"), slots, adapters)


def set_blas_threads(count: int) -> bool:
    """OpenBLAS's thread count for the whole process (numpy's matrix products): decode steps
    multiply small matrices, which threads only slow down on a busy machine. False where no
    OpenBLAS is loaded (numpy built against another BLAS)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return False
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                       "openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = getattr(library, symbol, None)
            if setter is not None:
                setter(int(count))
                return True
    return False
