"""A tokenizer for the llama.cpp path that does not import transformers (which imports torch: ~1.5 s of a cold
``skillbank plan`` on a small CPU).

It reads the same files a Hugging Face fast tokenizer directory holds (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``) with the Rust ``tokenizers`` library and jinja2, and offers the part of
``PreTrainedTokenizerFast`` that prompts, stops, grammars and decoding use here: ``apply_chat_template`` (text
only), ``__call__(text, add_special_tokens=False)``, ``decode``, ``eos_token_id``, ``all_special_ids``,
``added_tokens_decoder``, ``backend_tokenizer``, ``len()``. Written by hand because transformers offers no
torch-free entry point; tests check it against ``AutoTokenizer`` on the same directory (prompt ids, stops,
decoding).
"""
from __future__ import annotations

import json
from pathlib import Path

from skillbank.errors import ModelError


class LightTokenizer:
    def __init__(self, directory: str | Path):
        from tokenizers import Tokenizer

        directory = Path(directory)
        try:
            self.backend_tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
            config = json.loads((directory / "tokenizer_config.json").read_text())
        except (OSError, ValueError, Exception) as exc:  # noqa: BLE001 - tokenizers raises plain Exception
            raise ModelError(f"cannot read the tokenizer in {directory}: {exc}") from None
        template = config.get("chat_template")
        jinja = directory / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text()
        self.chat_template = template
        self._compiled = None
        self.eos_token = _content(config.get("eos_token"))
        self.eos_token_id = self.backend_tokenizer.token_to_id(self.eos_token) if self.eos_token else None
        added = self.backend_tokenizer.get_added_tokens_decoder()
        self.added_tokens_decoder = {i: t.content for i, t in added.items()}
        # as transformers counts them: the named special tokens, not every added one
        named = [_content(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")]
        named += [_content(t) for t in config.get("additional_special_tokens") or []]
        ids = (self.backend_tokenizer.token_to_id(t) for t in named if t)
        self.all_special_ids = sorted({i for i in ids if i is not None})

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, tokenize: bool = False, add_generation_prompt: bool = False,
                            **variables) -> str:
        if tokenize:
            raise ModelError("LightTokenizer renders chat templates as text only")
        if self._compiled is None:
            # The environment transformers renders chat templates in (sandboxed, trimmed blocks).
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._compiled = env.from_string(self.chat_template)
        return self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     eos_token=self.eos_token, **variables)


def _content(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


__all__ = ["LightTokenizer"]
