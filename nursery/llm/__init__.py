"""Serving language models from a Triton ``model.py``: a decode loop with continuous
(in-flight) batching, a KV cache per sequence, per-request LoRA adapters on shared weights,
and the byte-level BPE tokenizer the bundled ``tiny_llm`` uses (docs/llm.md).

Pure numpy: nothing here needs more than the server's own dependencies. The pieces:

- ``slots``: the slot scheduler (pure: which waiting request takes which free slot, by mode);
- ``engine``: the decode loop on its own thread (admit, prefill, one batched step, retire);
- ``decoder``: a small decoder-only transformer with a slot KV cache and per-row LoRA;
- ``sampling``: temperature / top-k / top-p / seed per row, stop strings, bad words;
- ``tokenizer``: byte-level BPE from a Hugging Face ``tokenizer.json``;
- ``weights``: safetensors files read and written with numpy, ``multi_lora.json``;
- ``serving``: Triton's TRT-LLM tensor names in and out of a decoupled ``model.py``.
"""
