"""A tiny tokenizer folder in Hugging Face's layout, made locally for the LLM tests (nothing
is downloaded): a ``tokenizers`` WordLevel model trained on a few sentences, and a
``tokenizer_config.json`` with a chat template, ``bos_token`` and ``eos_token``."""

from __future__ import annotations

import json
from pathlib import Path

SENTENCES = [
    "hello world", "the quick brown fox jumps over the lazy dog",
    "user assistant system", "tell me a story about a robot",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_tokenizer(folder: Path, template: str | None = CHAT_TEMPLATE) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(SENTENCES, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
