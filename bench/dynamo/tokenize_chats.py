"""Tokenizes chats the way Dynamo's frontend does, for the benchmark's
in-process kvroute arm.

Usage: python tokenize_chats.py MODEL_DIR < chats.jsonl > ids.jsonl

Each input line is a JSON list of messages; each output line is the JSON
list of the prompt's token ids: the model's chat template with the
generation prompt, tokenized without adding special tokens (the template
writes them).
"""

import json
import sys

from transformers import AutoTokenizer


def main():
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    for line in sys.stdin:
        messages = json.loads(line)
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        sys.stdout.write(json.dumps(ids) + "\n")


if __name__ == "__main__":
    main()
