package chattemplate_test

import (
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/chattemplate"
)

func ExampleTemplate_Render() {
	t, err := chattemplate.Parse(`{{- bos_token }}
{%- for m in messages %}
    {{- '<|' + m.role + '|>\n' + m.content | trim + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>
{% endif %}`)
	if err != nil {
		panic(err)
	}
	text, err := t.Render(map[string]any{
		"bos_token":             "<s>",
		"messages":              json.RawMessage(`[{"role": "user", "content": " What is KV caching? "}]`),
		"add_generation_prompt": true,
	}, chattemplate.Options{})
	fmt.Printf("%q, %v\n", text, err)
	// Output:
	// "<s><|user|>\nWhat is KV caching?\n<|assistant|>\n", <nil>
}

func ExampleParse_unsupported() {
	_, err := chattemplate.Parse(`{% include "header.jinja" %}`)
	fmt.Println(err)
	// Output:
	// line 1: chattemplate: unsupported: tag {% include %}
}
