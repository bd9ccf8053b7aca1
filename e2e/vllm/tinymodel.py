"""A tiny Llama written locally (there is no model hub here): 2 layers,
hidden 256, 4 heads, 2 KV heads, head_dim 64, bfloat16, random weights of
std 0.2 from a seed, and a word-level tokenizer whose words are "t3".."t2047",
so the text "t17 t912" is exactly the token ids [17, 912]. Two seeds give two
weight variants of one architecture: a decoder fed KV cache computed with the
other variant's weights answers differently, which is the negative control
of every KV-transfer test.

Usage: python tinymodel.py DIR SEED
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 2048
SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2; no word starts with "<"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if not loop.last %} {% endif %}{% endfor %}"
)


def word(i: int) -> str:
    return SPECIAL[i] if i < len(SPECIAL) else f"t{i}"


def text(ids) -> str:
    """The prompt text whose tokens are ids (ids >= 3)."""
    return " ".join(word(i) for i in ids)


def write(dir_: Path, seed: int, max_positions: int = 1024, sliding_window: int | None = None) -> Path:
    """With sliding_window, the same model as a Mistral whose attention
    sees only the last sliding_window tokens."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              PreTrainedTokenizerFast)

    dir_.mkdir(parents=True, exist_ok=True)
    shape = dict(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=max_positions,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    if sliding_window is None:
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = MistralForCausalLM(MistralConfig(**shape, sliding_window=sliding_window))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.to(torch.bfloat16).save_pretrained(dir_, safe_serialization=True)

    tok = Tokenizer(models.WordLevel({word(i): i for i in range(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(dir_)
    (dir_ / "mooncake-e2e.json").write_text(json.dumps({"seed": seed}))
    return dir_


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]))
