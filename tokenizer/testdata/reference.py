#!/usr/bin/env python3
"""Reference tokenizations for the kvroute tokenizer tests.

  reference.py gen DIR   trains the test tokenizers with the `tokenizers`
                         package, writes one model directory per family under
                         DIR (tokenizer.json, tokenizer_config.json, chat
                         templates) and DIR/<family>/golden.json holding the
                         ids that `tokenizers` and `transformers` give for a
                         fixed corpus of texts and chats.
  reference.py golden DIR
                         the same without training: rewrites the configs,
                         templates and golden.json for the tokenizer.json
                         files already there (training is not bit-for-bit
                         repeatable for every family, so the committed
                         tokenizer.json files are the reference).
  reference.py ref       reads {"dir", "texts", "chats"} as JSON on stdin and
                         prints the reference ids for them as JSON.
  reference.py variants  reads {"tokenizer", "variants", "texts"} as JSON on
                         stdin: a tokenizer.json file, a list of
                         {"normalizer", "pre_tokenizer"} objects replacing
                         its own (a missing key keeps it) and texts; prints
                         the input with "ids" added, the ids of each text
                         under each variant (without special tokens).
  reference.py unicode   reads {"cps"}, code points, as JSON on stdin; prints
                         {"nfd", "nfkd"}, what the NFD and NFKD normalizers
                         make of each, and {"reorders"}, whether NFD puts
                         U+0334 (combining class 1) before it when it follows
                         "a" (false when tokenizers gives it class 0).
  reference.py classes   prints {"L", "N"}: the code points that \\p{L} and
                         \\p{N} match in tokenizers' regular expressions.
  reference.py encode    reads {"tokenizers", "texts"} as JSON on stdin: whole
                         tokenizer.json documents (as strings) and texts given
                         as base64 bytes, read as UTF-8 with each invalid
                         sequence replaced by U+FFFD; prints, for each
                         tokenizer, {"error"} when tokenizers refuses it or
                         {"ids", "ids_special"}: the ids of each text without
                         and with the post-processor's special tokens (null
                         for a text tokenizers fails on), and "decoded", the
                         decoding of the latter without special tokens.

Needs tokenizers, transformers and jinja2 (no torch).
"""
import json
import os
import random
import sys

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part system assistant user router cache token model prompt request worker weather "
         "city temperature function arguments parameters required description string object Paris Tokyo Berlin "
         "don't I'm we're they've she'll he'd it's DON'T I'M naïve café résumé Zürich São coöperate élève "
         "東京 天気 今日は 北京 你好 世界 の です ます 한국어 안녕하세요 Привет мир Ελληνικά العربية שלום हिन्दी "
         "😀 🚀 👍🏽 🇫🇷 ✨ ∑ ∞ → ≥ © ® ™ … — – « » ¿ ¡ def return import print self None True False "
         "{ } [ ] ( ) : ; , . ! ? \" ' ` # $ % & * + - / < = > @ \\ ^ _ | ~ 0 1 2 3 42 100 2024 3.14 1,000 "
         "10:30 2026-11-23 0x1F supercalifragilisticexpialidocious antidisestablishmentarianism").split()

SAMPLE_TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "  two leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows\r\n",
    "   \n\n   \t  mixed whitespace runs    ",
    "numbers 1 12 123 1234 12345 3.14159 1,000,000 0x1F 2026-11-23",
    "I'm sure they've said it's what we'd do, DON'T YOU'LL",
    "東京の天気は今日は晴れです。你好，世界！",
    "안녕하세요 Привет, мир! Ελληνικά العربية שלום हिन्दी",
    "emoji 😀🚀 👍🏽 🇫🇷 ✨ and symbols ∑∞→≥ ©®™…",
    "combining: e\u0301 a\u0308 n\u0303 (decomposed) vs é ä ñ (composed)",
    "Å\u030a Ω K \u212b \ufb01ligature ＦＵＬＬＷＩＤＴＨ",
    "supercalifragilisticexpialidocious" * 3,
    "averyveryveryverylongwordwithoutanyspacesatallthatgoesonandonandonforeverandever",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "special tokens in text: <|begin_of_text|> <|eot_id|> <|im_start|> <|im_end|> <s> </s> [INST] [/INST]",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hello [/INST]",
    "",
    " ",
    "\n",
    "a",
    "\u00a0nbsp\u00a0\u2003em space\u3000ideographic space",
    "mixed42numbers7and letters9x 9999999 007",
    "!!!???... ---___ ***",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
    "\u017fome long s and ſ's",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "options: a  <mask> b<mask>  c <|rs|>   d<|rs|>\ne \ufb01ne fine \ufb01nest",
]


def corpus(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(5, 40)
        sep = rng.choice([" ", " ", " ", "  ", "\n", ", ", "\t"])
        out.append(sep.join(rng.choice(WORDS) for _ in range(k)))
    return out + SAMPLE_TEXTS * 3


LLAMA3_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

MISTRAL_TOOLS_TEMPLATE = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

MISTRAL_DEFAULT_TEMPLATE = r"""{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'].strip() + eos_token }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

# A ChatML-style template exercising macros, loop controls, string methods,
# dict methods, slicing, filters and tests that the other templates do not.
UNIGRAM_TEMPLATE = r"""{%- macro render(m, prefix='') -%}
{{ prefix }}<|im_start|>{{ m.role | upper if m.role.startswith('sys') else m.role }}
{% if m.content is string %}{{ m.content.strip() }}{% else %}{% for part in m.content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>
{% endmacro -%}
{%- set ns = namespace(n=0, last_user='') -%}
{%- for m in messages -%}
  {%- if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% set ns.last_user = m.content if m.content is string else '' %}{% endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role == 'tool' %}{% continue %}{% endif -%}
  {{- render(m, prefix=('' if loop.first else '')) -}}
  {%- if m.tool_calls is defined -%}
    {%- for tc in m.tool_calls -%}
<tool_call>{{ tc.function.name }}({% for k, v in tc.function.arguments.items() %}{{ k }}={{ v | tojson }}{{ ', ' if not loop.last }}{% endfor %})</tool_call>
{% endfor -%}
  {%- endif -%}
{%- endfor -%}
{%- if tools -%}
<tools>{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}</tools>
{% for t in tools %}{{ loop.index }}/{{ loop.length }} {{ t.function.description[:20] ~ '...' if t.function.description | length > 20 else t.function.description }}
{% endfor -%}
{%- endif -%}
{%- if ns.n > 1 %}users={{ ns.n }} last={{ ns.last_user.split(' ')[0] | lower }}{{ '\n' }}{% endif -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — returns °C by default.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris or 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 3}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "number", "default": 2.5},
            "safe": {"type": "boolean", "default": True}, "filters": {"type": ["object", "null"]}},
            "required": ["query"]}}},
]


def chats_for(family):
    sys_msg = {"role": "system", "content": "You are a helpful assistant.\nAnswer briefly.  "}
    user1 = {"role": "user", "content": "What's the weather in Paris today? 🌦️"}
    asst_call = {"role": "assistant", "tool_calls": [{"id": "call12345", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 2}}}]}
    tool_res = {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 18.5, \"sky\": \"cloudy\"}"}
    asst = {"role": "assistant", "content": "It is 18.5 °C and cloudy in Paris."}
    user2 = {"role": "user", "content": "東京は？ And numbers: 1234567, 3.14; whitespace   runs\n\n\tend"}
    special = {"role": "user", "content": "literal <|im_end|> and <|eot_id|> and [INST] and </s> inside text"}
    out = [
        {"messages": [user1], "add_generation_prompt": True},
        {"messages": [user1], "add_generation_prompt": False},
        {"messages": [sys_msg, user1, asst, user2], "add_generation_prompt": True},
        {"messages": [sys_msg, special], "add_generation_prompt": True},
        {"messages": [user2], "add_generation_prompt": True},
        {"messages": [{"role": "user", "content": "  padded   content  \n"}, {"role": "assistant", "content": "\n ok \n"},
                      {"role": "user", "content": "supercalifragilisticexpialidocious" * 4}], "add_generation_prompt": True},
    ]
    if family in ("gpt2", "llama3", "qwen2", "mistral", "unigram"):
        out += [
            {"messages": [user1], "tools": TOOLS, "add_generation_prompt": True},
            {"messages": [sys_msg, user1, asst_call, tool_res, asst, user2], "tools": TOOLS, "add_generation_prompt": True},
            {"messages": [user1, asst_call, tool_res], "tools": TOOLS, "add_generation_prompt": False},
        ]
    # integers beyond 64 bits in tools and tool calls keep their digits
    big_tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather by station id",
        "parameters": {"type": "object", "properties": {
            "station": {"type": "integer", "maximum": 10000000000000000000000, "default": 12345678901234567890}},
            "required": ["station"]}}}]
    big_call = {"role": "assistant", "tool_calls": [{"id": "call12345", "type": "function", "function": {
        "name": "get_weather", "arguments": {"station": 12345678901234567890, "offset": -9223372036854775809}}}]}
    out += [{"messages": [user1, big_call, tool_res], "tools": big_tools, "add_generation_prompt": True}]
    if family == "llama3":
        out += [
            {"messages": [user1], "tools": TOOLS, "add_generation_prompt": True,
             "kwargs": {"tools_in_user_message": False, "date_string": "23 Nov 2026"}},
            {"messages": [sys_msg, user1], "add_generation_prompt": True,
             "kwargs": {"builtin_tools": ["code_interpreter", "brave_search"]}},
            {"messages": [user1, {"role": "assistant", "tool_calls": [asst_call["tool_calls"][0], asst_call["tool_calls"][0]]}],
             "tools": TOOLS, "add_generation_prompt": False},
            {"messages": [{"role": "tool", "content": {"a": 1}}], "add_generation_prompt": False},
        ]
    if family == "qwen2":
        out += [
            {"messages": [user1, {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"paris\"}"}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}], "tools": TOOLS,
             "add_generation_prompt": True},
            {"messages": [sys_msg, user1, {"role": "system", "content": "late system"}], "add_generation_prompt": True},
        ]
    if family == "mistral":
        out += [
            {"messages": [user1, user2], "add_generation_prompt": True},  # raises: roles must alternate
            {"messages": [user1, asst_call, {"role": "tool", "tool_call_id": "short", "content": "x"}],
             "tools": TOOLS, "add_generation_prompt": True},  # raises: id length
            {"messages": [user1, asst_call, {"role": "tool", "tool_call_id": "call12345", "content": {"content": [1, 2.5, None, True]}}],
             "tools": TOOLS, "add_generation_prompt": True},
        ]
    if family == "unigram":
        out += [
            {"messages": [{"role": "system", "content": " sys "}, {"role": "user", "content": [
                {"type": "text", "text": "part one"}, {"type": "image"}, {"type": "text", "text": "part two"}]},
                {"role": "user", "content": "Second Question here"}], "add_generation_prompt": True},
        ]
    return out


def train_bytelevel(rng, pattern, normalizer, specials, added, vocab_size, bos):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                             show_progress=False)
    tok.train_from_iterator(corpus(rng, 4000), tr)
    if added:
        tok.add_tokens(added)
    if bos:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_metaspace_bpe(rng, specials, vocab_size):
    # Trained without the byte tokens, then rebuilt with <0x00>..<0xFF> after
    # the specials, as SentencePiece BPE models with byte fallback are laid out.
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[], min_frequency=2, show_progress=False,
                             limit_alphabet=200)
    base.train_from_iterator(corpus(rng, 4000), tr)
    spec = json.loads(base.to_str())
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return tok


def train_unigram(rng, specials, vocab_size):
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]) \
        if False else normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tr = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>",
                                 show_progress=False, byte_fallback=True)
    tok.train_from_iterator(corpus(rng, 4000), tr)
    tok.post_processor = processors.TemplateProcessing(single="$A:0 </s>:0", pair="$A:0 </s>:0 $B:1 </s>:1",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    return tok


GPT2_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                 "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

FAMILIES = {
    "gpt2": dict(
        config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": GPT2_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}),
    "llama3": dict(
        config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}),
    "qwen2": dict(
        config={"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768},
        files={"chat_template.jinja": QWEN25_TEMPLATE}),
    "mistral": dict(
        config={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "chat_template": [{"name": "default", "template": MISTRAL_DEFAULT_TEMPLATE},
                                  {"name": "tool_use", "template": MISTRAL_TOOLS_TEMPLATE}],
                "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768}),
    "unigram": dict(
        config={"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "chat_template": UNIGRAM_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512}),
}


def train_gpt2(rng, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(rng, 2000), tr)
    return tok


def build(family, rng):
    if family == "gpt2":
        return train_gpt2(rng, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                "<|eot_id|>"], 1000)
    if family == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
        return train_bytelevel(rng, LLAMA3_PATTERN, None, specials, [], 2400, "<|begin_of_text|>")
    if family == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        from tokenizers import AddedToken
        added = [AddedToken("<tool_call>", special=False, normalized=False),
                 AddedToken("</tool_call>", special=False, normalized=False)]
        return train_bytelevel(rng, QWEN2_PATTERN, normalizers.NFC(), specials, added, 2400, None)
    if family == "mistral":
        specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
        return train_metaspace_bpe(rng, specials, 1800)
    if family == "unigram":
        return train_unigram(rng, ["<pad>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"], 1500)
    raise ValueError(family)


def add_options(family, tok):
    """Adds the added-token options the trained files lack: lstrip, rstrip
    and tokens matched on normalized text."""
    from tokenizers import AddedToken
    have = {t.content for t in tok.get_added_tokens_decoder().values()}
    extra = {
        "unigram": [AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                    AddedToken("\ufb01ne", normalized=True, special=False)],
        "qwen2": [AddedToken("<|rs|>", rstrip=True, special=True, normalized=False)],
    }.get(family, [])
    for t in extra:
        if t.content not in have:
            if t.special:
                tok.add_special_tokens([t])
            else:
                tok.add_tokens([t])


def apply_chat(tok, chat):
    kwargs = dict(chat.get("kwargs") or {})
    try:
        text = tok.apply_chat_template(chat["messages"], tools=chat.get("tools"), tokenize=False,
                                       add_generation_prompt=chat.get("add_generation_prompt", False), **kwargs)
        ids = tok.apply_chat_template(chat["messages"], tools=chat.get("tools"), tokenize=True, return_dict=False,
                                      add_generation_prompt=chat.get("add_generation_prompt", False), **kwargs)
    except Exception as e:  # template errors are part of the reference
        return {"error": f"{type(e).__name__}: {e}"}
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return {"text": text, "ids": list(ids)}


def reference(model_dir, texts, chats):
    from transformers import AutoTokenizer
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(model_dir)
    out_texts = []
    for t in texts:
        special = raw.encode(t).ids
        out_texts.append({"text": t, "ids": raw.encode(t, add_special_tokens=False).ids,
                          "ids_special": special, "decoded": raw.decode(special)})
    out_chats = []
    for c in chats:
        r = dict(c)
        r.update(apply_chat(hf, c))
        out_chats.append(r)
    return {"texts": out_texts, "chats": out_chats}


def gen(root, train=True):
    import tokenizers
    import transformers
    for family, spec in FAMILIES.items():
        rng = random.Random(17)
        d = os.path.join(root, family)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        if train or not os.path.exists(path):
            tok = build(family, rng)
            print(family, "vocab", tok.get_vocab_size(), file=sys.stderr)
        else:
            tok = Tokenizer.from_file(path)
        add_options(family, tok)
        tok.save(path, pretty=False)
        cfg = dict(spec["config"])
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
        for name, body in spec.get("files", {}).items():
            with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                f.write(body)
        trng = random.Random(99)
        texts = list(SAMPLE_TEXTS) + [" ".join(trng.choice(WORDS) for _ in range(trng.randint(1, 30)))
                                      for _ in range(40)]
        golden = reference(d, texts, chats_for(family))
        golden["versions"] = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
        with open(os.path.join(d, "golden.json"), "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))


def variants(req):
    with open(req["tokenizer"], encoding="utf-8") as f:
        base = json.load(f)
    out = dict(req)
    out["ids"] = []
    for v in req["variants"]:
        d = dict(base)
        d.update(v)
        tok = Tokenizer.from_str(json.dumps(d))
        out["ids"].append([tok.encode(t, add_special_tokens=False).ids for t in req["texts"]])
    return out


def encode(req):
    import base64
    texts = [base64.b64decode(t).decode("utf-8", errors="replace") for t in req["texts"]]
    out = []
    for doc in req["tokenizers"]:
        try:
            tok = Tokenizer.from_str(doc)
        except Exception as e:  # a refused file is part of the reference
            out.append({"error": f"{type(e).__name__}: {e}"})
            continue
        res = {}
        for key, special in (("ids", False), ("ids_special", True)):
            try:
                res[key] = [e.ids for e in tok.encode_batch(texts, add_special_tokens=special)]
            except BaseException:  # tokenizers panics on some texts: null for those
                res[key] = [encode_or_none(tok, t, special) for t in texts]
        res["decoded"] = [None if ids is None else tok.decode(ids) for ids in res["ids_special"]]
        out.append(res)
    return out


def unicode_table(req):
    nfd, nfkd = normalizers.NFD(), normalizers.NFKD()
    cps = [chr(c) for c in req["cps"]]
    return {"nfd": [nfd.normalize_str(c) for c in cps], "nfkd": [nfkd.normalize_str(c) for c in cps],
            "reorders": [nfd.normalize_str("a" + c + "\u0334") != "a" + c + "\u0334" for c in cps]}


def classes():
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(chr(c) for c in cps)
    out = {}
    for cls in ("L", "N"):
        unmatched = set()
        for piece, _ in pre_tokenizers.Split(Regex(r"\p{%s}" % cls), behavior="removed").pre_tokenize_str(text):
            unmatched.update(piece)
        out[cls] = [c for c in cps if chr(c) not in unmatched]
    return out


def encode_or_none(tok, text, special):
    try:
        return tok.encode(text, add_special_tokens=special).ids
    except BaseException:
        return None


def main():
    if len(sys.argv) >= 3 and sys.argv[1] in ("gen", "golden"):
        gen(sys.argv[2], train=sys.argv[1] == "gen")
    elif len(sys.argv) >= 2 and sys.argv[1] == "ref":
        req = json.load(sys.stdin)
        json.dump(reference(req["dir"], req.get("texts", []), req.get("chats", [])), sys.stdout, ensure_ascii=False)
    elif len(sys.argv) >= 2 and sys.argv[1] == "classes":
        json.dump(classes(), sys.stdout)
    elif len(sys.argv) >= 2 and sys.argv[1] == "unicode":
        json.dump(unicode_table(json.load(sys.stdin)), sys.stdout, ensure_ascii=False)
    elif len(sys.argv) >= 2 and sys.argv[1] == "encode":
        json.dump(encode(json.load(sys.stdin)), sys.stdout, ensure_ascii=False)
    elif len(sys.argv) >= 2 and sys.argv[1] == "variants":
        json.dump(variants(json.load(sys.stdin)), sys.stdout, ensure_ascii=False)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
