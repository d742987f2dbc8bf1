"""nursery/llm's decoder and weights, numerically: a KV-cached, batched decode step gives
what the plain computation gives, token for token; a LoRA adapter on one row of a mixed
batch equals the base model with that adapter merged into its weights."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from nursery.llm.decoder import LINEARS, Decoder, DecoderConfig
from nursery.llm.engine import Chunk, DecodeLoop, Job
from nursery.llm.sampling import SamplingParams
from nursery.llm.weights import (
    Adapter,
    WeightsError,
    load_adapter,
    load_safetensors,
    read_multi_lora,
    save_safetensors,
)

CONFIG = DecoderConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=48,
                       max_position_embeddings=64, bos_token_id=0, eos_token_id=1)
SHAPES = {"attn.qkv": (96, 32), "attn.out": (32, 32), "mlp.up": (48, 32), "mlp.down": (32, 48)}


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"embed.weight": rng.standard_normal((97, 32)).astype(np.float32) * 0.5,
         "pos.weight": rng.standard_normal((64, 32)).astype(np.float32) * 0.1,
         "ln_f.weight": np.ones(32, np.float32), "ln_f.bias": np.zeros(32, np.float32)}
    for i in range(2):
        for name, shape in SHAPES.items():
            w[f"layers.{i}.{name}.weight"] = (rng.standard_normal(shape) / np.sqrt(shape[1])
                                              ).astype(np.float32)
        for norm in ("ln1", "ln2"):
            w[f"layers.{i}.{norm}.weight"] = 1 + 0.1 * rng.standard_normal(32).astype(np.float32)
            w[f"layers.{i}.{norm}.bias"] = 0.1 * rng.standard_normal(32).astype(np.float32)
    return w


def adapter(name: str, rank: int, seed: int) -> Adapter:
    rng = np.random.default_rng(seed)
    modules = {}
    for i in range(2):
        for module in LINEARS:
            out_dim, in_dim = SHAPES[module]
            modules[f"layers.{i}.{module}"] = (
                rng.standard_normal((rank, in_dim)).astype(np.float32) / np.sqrt(in_dim),
                rng.standard_normal((out_dim, rank)).astype(np.float32) / np.sqrt(rank))
    return Adapter(name, 2.0 / rank, rank, modules)


def reference_logits(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The whole sequence from scratch, no cache: the last position's logits."""
    return Decoder(CONFIG, w, 1).prefill(0, ids)


def test_a_cached_step_equals_running_the_longer_prompt() -> None:
    w = weights()
    model = Decoder(CONFIG, w, 4)
    prompt = [5, 9, 13, 2, 77]
    model.prefill(2, prompt)
    step = model.decode([2], [40])[0]
    np.testing.assert_allclose(step, reference_logits(w, [*prompt, 40]), rtol=1e-4, atol=1e-4)


def test_batched_decode_with_kv_cache_equals_unbatched_greedy_token_for_token() -> None:
    """Sequences of different lengths admitted at different steps (continuous batching: later
    ones join sequences already running, finished ones leave) decode exactly what each
    decodes alone, one request at a time."""
    prompts = [[3, 4, 5], [10, 11, 12, 13, 14, 15, 16], [20], [30, 31, 32, 33], [60, 61]]

    def run(mode: str, slots: int) -> list[str]:
        texts = [""] * len(prompts)

        def emit(i: int) -> Callable[[Chunk], None]:
            def put(chunk: Chunk) -> None:
                texts[i] += chunk.text
            return put

        # each token's "text" is its id: the streamed text spells the token sequence
        loop = DecodeLoop(Decoder(CONFIG, weights(), slots), lambda t: f"{t} ".encode(),
                          slots, mode)
        for i, prompt in enumerate(prompts):
            loop.submit(Job(prompt, 6 + 4 * i, emit(i), SamplingParams(temperature=0.0)))
            loop.pending()
            loop.step()
        while not loop.scheduler.idle:
            loop.step()
        return texts

    batched = run("continuous", 3)  # fewer slots than requests: some wait, then take a slot
    assert [len(t.split()) for t in batched] == [6 + 4 * i for i in range(len(prompts))]
    assert batched == run("sequential", 1)
    assert batched == run("static", 3)


def greedy_tokens(model: Decoder, slot: int, prompt: list[int], n: int, adapter: int = 0
                  ) -> list[int]:
    out = [int(np.argmax(model.prefill(slot, prompt, adapter)))]
    for _ in range(n - 1):
        out.append(int(np.argmax(model.decode([slot], [out[-1]], [adapter])[0])))
    return out


def test_batched_greedy_equals_alone() -> None:
    """The decode step itself: four slots stepped together (one of them idle in the middle of
    the span) give each the tokens it gets stepped alone."""
    prompts = {0: [3, 4, 5], 1: [10, 11, 12, 13, 14, 15], 3: [20], 5: [30, 31, 32, 33]}
    alone = {s: greedy_tokens(Decoder(CONFIG, weights(), 1), 0, p, 20) for s, p in
             prompts.items()}
    model = Decoder(CONFIG, weights(), 6)
    together = {s: [int(np.argmax(model.prefill(s, p)))] for s, p in prompts.items()}
    for _ in range(19):
        slots = list(together)
        logits = model.decode(slots, [together[s][-1] for s in slots])
        for s, row in zip(slots, logits, strict=True):
            together[s].append(int(np.argmax(row)))
    assert together == alone


def test_a_prompt_run_in_chunks_equals_the_prompt_run_at_once() -> None:
    """Chunked prefill in the decoder: a prompt fed in pieces at their offsets (each attending
    to the cache of the pieces before it), in passes shared with decoding rows of another
    slot, leaves the same cache and gives the same logits as the prompt in one piece."""
    w = weights()
    alpha = adapter("alpha", 4, 1)
    prompt = [int(t) for t in np.random.default_rng(3).integers(2, 97, 23)]
    whole = Decoder(CONFIG, w, 2, [alpha])
    want = whole.prefill(1, prompt, 1)
    pieces = Decoder(CONFIG, w, 2, [alpha])
    pieces.prefill(0, [5, 6, 7])
    token = 8
    start = 0
    for size in (1, 7, 2, 13):
        _, rows = pieces.step([0], [token], None, [(1, prompt[start:start + size], 1, start)])
        start += size
        token += 1
    np.testing.assert_allclose(rows[0], want, rtol=1e-5, atol=1e-5)
    assert pieces.lengths[1] == 23 and pieces.lengths[0] == 7
    for k_whole, k_pieces in zip(whole.k, pieces.k, strict=True):
        np.testing.assert_allclose(k_pieces[1, :, :23], k_whole[1, :, :23], rtol=1e-5, atol=1e-5)
    # and decoding goes on from the chunked cache as from the whole one
    np.testing.assert_allclose(pieces.decode([1], [40], [1])[0], whole.decode([1], [40], [1])[0],
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="does not follow"):
        pieces.prefill(1, [3, 4], 0, start=5)
    with pytest.raises(ValueError, match="does not fit"):
        pieces.prefill(1, [3] * 60, 0, start=24)
    # a slot once per step: decoded and fed a chunk, or fed two chunks, is refused whole
    before = pieces.lengths.copy()
    with pytest.raises(ValueError, match="a slot appears twice in one step"):
        pieces.step([1], [9], None, [(1, [3, 4], 0, 24)])
    with pytest.raises(ValueError, match="a slot appears twice in one step"):
        pieces.step([], [], None, [(0, [3], 0, 0), (0, [4], 0, 0)])
    np.testing.assert_array_equal(pieces.lengths, before)


def merged(w: dict[str, np.ndarray], a: Adapter) -> dict[str, np.ndarray]:
    out = dict(w)
    for module, (lora_a, lora_b) in a.modules.items():
        key = f"{module}.weight"
        out[key] = w[key] + a.scale * (lora_b @ lora_a)
    return out


def test_lora_rows_equal_merged_weights_in_a_mixed_batch() -> None:
    w = weights()
    alpha, beta = adapter("alpha", 4, 1), adapter("beta", 8, 2)
    model = Decoder(CONFIG, w, 3, [alpha, beta])
    assert model.adapter_names == ["", "alpha", "beta"]
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    rows = [1, 0, 2]  # alpha, no adapter, beta: one batch
    for slot, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        model.prefill(slot, prompt, row)
    logits = model.decode([0, 1, 2], [12, 13, 14], rows)
    expect = [Decoder(CONFIG, merged(w, alpha), 1).prefill(0, [*prompts[0], 12]),
              Decoder(CONFIG, w, 1).prefill(0, [*prompts[1], 13]),
              Decoder(CONFIG, merged(w, beta), 1).prefill(0, [*prompts[2], 14])]
    for got, want in zip(logits, expect, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # and the adapter changes the answer (the base weights were not touched)
    assert not np.allclose(logits[0], Decoder(CONFIG, w, 1).prefill(0, [*prompts[0], 12]),
                           atol=1e-3)


def test_safetensors_round_trip_and_peft_adapter_folder(tmp_path: Path) -> None:
    a = adapter("alpha", 4, 1)
    folder = tmp_path / "1" / "loras" / "alpha"
    folder.mkdir(parents=True)
    tensors = {}
    for module, (lora_a, lora_b) in a.modules.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = lora_a.astype(np.float16)
        tensors[f"base_model.model.{module}.lora_B.weight"] = lora_b
    save_safetensors(folder / "adapter_model.safetensors", tensors, {"format": "pt"})
    back = load_safetensors(folder / "adapter_model.safetensors")
    assert set(back) == set(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and np.array_equal(back[key], value)
    (folder / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    (tmp_path / "1" / "multi_lora.json").write_text('{"alpha": "loras/alpha"}')
    listing = read_multi_lora(tmp_path / "1")
    assert listing == {"alpha": folder}
    loaded = load_adapter("alpha", listing["alpha"])
    assert loaded.scale == 2.0 and set(loaded.modules) == set(a.modules)


def test_bad_weights_are_named(tmp_path: Path) -> None:
    w = weights()
    del w["layers.1.mlp.up.weight"]
    with pytest.raises(WeightsError, match="layers.1.mlp.up.weight"):
        Decoder(CONFIG, w, 1)
    (tmp_path / "broken.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(WeightsError, match="broken.safetensors"):
        load_safetensors(tmp_path / "broken.safetensors")
    wrong = Adapter("wide", 1.0, 2, {"layers.0.attn.out": (np.zeros((2, 7), np.float32),
                                                           np.zeros((32, 2), np.float32))})
    with pytest.raises(WeightsError, match="LoRA 'wide'"):
        Decoder(CONFIG, weights(), 1, [wrong])


def test_chunks_count_every_token() -> None:
    """The loop's chunks: one per token, the last one final with its finish reason."""
    chunks: list[Chunk] = []
    loop = DecodeLoop(Decoder(CONFIG, weights(), 2), lambda t: b"x", 2)
    loop.submit(Job([3, 4], 5, chunks.append, SamplingParams(temperature=0.0)))
    loop.pending()
    while not loop.scheduler.idle:
        loop.step()
    assert [c.tokens for c in chunks] == [1] * 5
    assert [c.final for c in chunks] == [False] * 4 + [True]
    assert chunks[-1].finish == "length" and "".join(c.text for c in chunks) == "xxxxx"


def test_the_bundled_model_is_what_make_llm_writes() -> None:
    """scripts/make_llm.py and the committed tiny_llm agree (its config, its model.py, the
    decoder's shape), so running the script again changes only the random parts."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("make_llm", root / "scripts" / "make_llm.py")
    assert spec is not None and spec.loader is not None
    make_llm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_llm)
    model = root / "model_repository" / "tiny_llm"
    assert (model / "config.pbtxt").read_text() == make_llm.config_pbtxt()
    assert (model / "1" / "model.py").read_text() == make_llm.MODEL_PY
    assert DecoderConfig.from_file(model / "1" / "config.json") == make_llm.CONFIG
    listing = read_multi_lora(model / "1")
    assert sorted(listing) == ["alpha", "beta"]
    adapters = [load_adapter(name, folder) for name, folder in listing.items()]
    decoder = Decoder(make_llm.CONFIG, load_safetensors(model / "1" / "model.safetensors"), 1,
                      adapters)
    assert decoder.adapter_names == ["", "alpha", "beta"] and decoder.head_bias is not None
