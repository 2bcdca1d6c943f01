"""Writes a tokenizer-only model directory for Dynamo's mocker engines.

Usage: python mkmodel.py OUT_DIR

The directory holds a byte-level BPE tokenizer trained here with the
`tokenizers` package (vocabulary of 4,096 ids: the mocker emits output ids
around 1,000-2,000, so the vocabulary must cover them), a Llama-3-like chat
template in tokenizer_config.json, config.json and generation_config.json.
Nothing is downloaded. The training corpus is drawn from the same word list
as the benchmark's prompts (bench/dynamo/workload.go), so a word costs about
one token and prompt lengths in tokens are close to their lengths in words.
"""

import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB = 4096
WORDS = """the of and to in is you that it he was for on are as with his they at be this
have from or one had by word but not what all were we when your can said there use an each
which she do how their if will up other about out many then them these so some her would make
like him into time has look two more write go see number no way could people my than first
water been call who oil its now find long down day did get come made may part system assistant
user router cache token model prompt request worker block prefix engine query answer context
document section table result value field record server client index event stream batch queue""".split()

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: mkmodel.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
    )
    tok.train_from_iterator(corpus, trainer)
    n = tok.get_vocab_size()
    if n < VOCAB:  # a small corpus stops short: pad with reserved tokens
        tok.add_tokens([f"<|reserved_{i}|>" for i in range(VOCAB - n)])
    tok.save(os.path.join(out, "tokenizer.json"))
    write(out, "tokenizer_config.json", {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
    })
    write(out, "config.json", {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "max_position_embeddings": 131072,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "bos_token_id": 0,
        "eos_token_id": 4,
        "torch_dtype": "bfloat16",
    })
    write(out, "generation_config.json", {"bos_token_id": 0, "eos_token_id": 4})
    print("vocab", tok.get_vocab_size())


def write(out, name, obj):
    with open(os.path.join(out, name), "w") as f:
        json.dump(obj, f, indent=1)


if __name__ == "__main__":
    main()
