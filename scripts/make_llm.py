#!/usr/bin/env python3
"""Make the bundled language model, ``model_repository/tiny_llm``: random weights, a
tokenizer trained here, two LoRA adapters. Nothing is downloaded.

    python scripts/make_llm.py                 # rewrites model_repository/tiny_llm
    python scripts/make_llm.py OUT_DIR         # writes OUT_DIR/tiny_llm

Needs Hugging Face's ``tokenizers`` (the ``llm`` extra) to train the tokenizer; serving it
does not (nursery/llm/tokenizer.py reads the tokenizer.json this writes). The files are
committed (about 2 MB), so ``pip install -e . && python -m nursery serve`` serves the model
on a fresh machine; run this again only to change it. What it writes:

  tiny_llm/config.pbtxt                 decoupled Python model, TRT-LLM tensor names
  tiny_llm/tokenizer/                   tokenizer.json (byte-level BPE, 2,048 ids, trained on
                                        the project's README and docs), tokenizer_config.json
                                        (bos/eos tokens, a Jinja chat_template)
  tiny_llm/1/model.py                   the Triton model: nursery.llm.serving.DecoderServer
  tiny_llm/1/config.json                the decoder's shape (4 layers, width 128, context 512)
  tiny_llm/1/model.safetensors          its weights (float16, random, with an output bias of
                                        the docs' token frequencies: the text is word salad)
  tiny_llm/1/multi_lora.json            {"alpha": "loras/alpha", "beta": "loras/beta"}
  tiny_llm/1/loras/<name>/              PEFT layout: adapter_config.json and
                                        adapter_model.safetensors (rank 4 and 8)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nursery.llm.decoder import LINEARS, DecoderConfig  # noqa: E402
from nursery.llm.weights import save_safetensors  # noqa: E402

# Pieces the BPE never merges across: letters, digits, other symbols, whitespace runs (the
# last space of a run joins the next word, as in GPT-2). ASCII classes only, so Python's re
# and the Rust regex engine of `tokenizers` split every text the same way.
SPLIT = r" ?[A-Za-z]+| ?[0-9]+| ?[^ \t\n\rA-Za-z0-9]+|[ \t\n\r]+(?![^ \t\n\r])|[ \t\n\r]+"
SPECIAL = ["<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
CONFIG = DecoderConfig(vocab_size=2048, hidden_size=128, num_hidden_layers=4,
                       num_attention_heads=4, intermediate_size=256,
                       max_position_embeddings=512, bos_token_id=0, eos_token_id=1)
ADAPTERS = {"alpha": (4, ["attn.qkv", "attn.out"]), "beta": (8, list(LINEARS))}

MODEL_PY = '''"""tiny_llm: a small random-weight decoder served with continuous batching and
multi-LoRA by nursery.llm (docs/llm.md). Made by scripts/make_llm.py."""

import triton_python_backend_utils as pb_utils

from nursery.llm.serving import DecoderServer


class TritonPythonModel:
    def initialize(self, args):
        self.server = DecoderServer(args, pb_utils)

    def execute(self, requests):
        for request in requests:
            self.server.submit(request)  # answered from the decode loop's thread
        return None

    def finalize(self):
        self.server.close()
'''


def config_pbtxt(name: str = "tiny_llm", mode: str = "continuous", slots: int = 32) -> str:
    def tensor(n: str, dtype: str, dims: str, optional: bool = True) -> str:
        opt = " optional: true" if optional else ""
        return f'  {{ name: "{n}" data_type: {dtype} dims: [ {dims} ]{opt} }}'

    inputs = [tensor("text_input", "TYPE_STRING", "1", optional=False),
              tensor("stream", "TYPE_BOOL", "1"),
              tensor("max_tokens", "TYPE_INT32", "1"),
              tensor("stop_words", "TYPE_STRING", "-1"),
              tensor("bad_words", "TYPE_STRING", "-1"),
              tensor("temperature", "TYPE_FP32", "1"),
              tensor("top_p", "TYPE_FP32", "1"),
              tensor("top_k", "TYPE_INT32", "1"),
              tensor("seed", "TYPE_UINT64", "1"),
              tensor("exclude_input_in_output", "TYPE_BOOL", "1"),
              tensor("return_num_input_tokens", "TYPE_BOOL", "1"),
              tensor("return_num_output_tokens", "TYPE_BOOL", "1")]
    outputs = [tensor("text_output", "TYPE_STRING", "-1", optional=False),
               tensor("num_input_tokens", "TYPE_UINT32", "1", optional=False),
               tensor("num_output_tokens", "TYPE_UINT32", "1", optional=False)]
    params = {"batching_mode": mode, "max_slots": str(slots), "default_max_tokens": "16",
              "exclude_input_in_output": "true", "tokenizer": "tokenizer", "blas_threads": "1"}
    lines = [f'name: "{name}"', 'backend: "python"',
             "# one prompt per request (TRT-LLM's shape: [1, 1] with the batch dimension);",
             "# requests are batched by the decode loop, not by Triton's batcher",
             "max_batch_size: 1",
             "model_transaction_policy { decoupled: true }",
             "input [", ",\n".join(inputs), "]", "output [", ",\n".join(outputs), "]",
             "instance_group [ { count: 1 kind: KIND_CPU } ]",
             "# batching_mode: continuous | static | sequential (docs/llm.md);",
             "# max_num_batched_tokens (tokens a decode step runs, chunked prefill): max_slots;",
             "# max_prefill_overhead (continuous: a step with prompt tokens costs at most",
             "# this much more than its decode rows alone): off"]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
              for k, v in params.items()]
    return "\n".join(lines) + "\n"


def train_tokenizer(out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=CONFIG.vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    assert tok.token_to_id("<|bos|>") == CONFIG.bos_token_id
    assert tok.token_to_id("<|end|>") == CONFIG.eos_token_id
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>", "eos_token": "<|end|>", "pad_token": "<|end|>",
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": CONFIG.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")


def random_weights(rng: np.random.Generator, prior: np.ndarray | None = None,
                   config: DecoderConfig = CONFIG) -> dict[str, np.ndarray]:
    """Random weights; ``prior`` (log frequencies of the tokens) becomes the output bias, so
    sampled text draws on the words of the docs rather than on every byte alike."""
    c = config
    d, f = c.hidden_size, c.intermediate_size

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float16)

    w = {"embed.weight": normal(c.vocab_size, d, std=0.05),
         "pos.weight": normal(c.max_position_embeddings, d, std=0.1)}
    shapes = {"attn.qkv": (3 * d, d), "attn.out": (d, d), "mlp.up": (f, d), "mlp.down": (d, f)}
    for i in range(c.num_hidden_layers):
        for name, (out_dim, in_dim) in shapes.items():
            w[f"layers.{i}.{name}.weight"] = normal(out_dim, in_dim, std=2.0 / np.sqrt(in_dim))
        for norm in ("ln1", "ln2"):
            w[f"layers.{i}.{norm}.weight"] = np.ones(d, np.float16)
            w[f"layers.{i}.{norm}.bias"] = np.zeros(d, np.float16)
    w["ln_f.weight"] = np.ones(d, np.float16)
    w["ln_f.bias"] = np.zeros(d, np.float16)
    if prior is not None:
        w["lm_head.bias"] = prior.astype(np.float16)
    return w


def token_prior(tokenizer_json: Path) -> np.ndarray:
    """Log frequency of each id in the docs the tokenizer was trained on (add-one)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    counts = np.ones(CONFIG.vocab_size)
    for text in corpus():
        np.add.at(counts, tok.encode(text).ids, 1)
    return np.log(counts / counts.sum())


def corpus() -> list[str]:
    return [p.read_text(encoding="utf-8") for p in
            sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])]


def write_adapter(folder: Path, rank: int, targets: list[str], rng: np.random.Generator) -> None:
    c = CONFIG
    d, f = c.hidden_size, c.intermediate_size
    shapes = {"attn.qkv": (3 * d, d), "attn.out": (d, d), "mlp.up": (f, d), "mlp.down": (d, f)}
    tensors = {}
    for i in range(c.num_hidden_layers):
        for name in targets:
            out_dim, in_dim = shapes[name]
            key = f"base_model.model.layers.{i}.{name}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, in_dim))
                                               / np.sqrt(in_dim)).astype(np.float16)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out_dim, rank))
                                               / np.sqrt(rank)).astype(np.float16)
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors(folder / "adapter_model.safetensors", tensors, {"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": rank,
        "target_modules": targets, "bias": "none",
        "base_model_name_or_path": "tiny_llm"}, indent=2) + "\n")


def write_tiny_llm(repo: Path, name: str = "tiny_llm", mode: str = "continuous",
                   slots: int = 32) -> Path:
    """The model folder ``repo/name`` (the tokenizer trained anew)."""
    model = repo / name
    if model.exists():
        shutil.rmtree(model)
    version = model / "1"
    version.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config_pbtxt(name, mode, slots))
    train_tokenizer(model / "tokenizer")
    (version / "model.py").write_text(MODEL_PY)
    rng = np.random.default_rng(20261124)
    write_weights(model, CONFIG, rng)
    listing = {}
    for adapter, (rank, targets) in ADAPTERS.items():
        write_adapter(version / "loras" / adapter, rank, targets, rng)
        listing[adapter] = f"loras/{adapter}"
    (version / "multi_lora.json").write_text(json.dumps(listing, indent=2) + "\n")
    return model


def widen(model: Path, width: int, layers: int) -> DecoderConfig:
    """Give a copy of tiny_llm (``model``: its folder) wider and deeper random weights, same
    vocabulary and tokenizer, no LoRA adapters: a decoder whose step costs what a real one's
    does relative to the serving path (bench/llm_batching.py --width)."""
    config = dataclasses.replace(CONFIG, hidden_size=width, num_hidden_layers=layers,
                                 num_attention_heads=max(1, width // 32),
                                 intermediate_size=4 * width)
    write_weights(model, config, np.random.default_rng(20261124))
    shutil.rmtree(model / "1" / "loras", ignore_errors=True)
    (model / "1" / "multi_lora.json").unlink(missing_ok=True)
    return config


def write_weights(model: Path, config: DecoderConfig, rng: np.random.Generator) -> None:
    """``config.json`` and random ``model.safetensors`` in the model's version folder, the
    output bias drawn from its tokenizer's token frequencies."""
    version = model / "1"
    (version / "config.json").write_text(json.dumps(config.as_json(), indent=2) + "\n")
    prior = token_prior(model / "tokenizer" / "tokenizer.json")
    save_safetensors(version / "model.safetensors", random_weights(rng, prior, config),
                     {"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=str(ROOT / "model_repository"))
    args = parser.parse_args()
    print(write_tiny_llm(Path(args.out)))


if __name__ == "__main__":
    main()
