package tokenizer_test

import (
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

func ExampleTokenizer_Encode() {
	tok, err := tokenizer.FromFile("testdata/llama3/tokenizer.json")
	if err != nil {
		panic(err)
	}
	ids := tok.Encode(nil, "the router cache", true) // with the BOS token
	fmt.Println(ids)
	fmt.Printf("%q\n", tok.Decode(ids, true))
	// Output:
	// [0 296 823 860]
	// "the router cache"
}

func ExampleModel_EncodeChat() {
	m, err := tokenizer.LoadModel("testdata/qwen2", tokenizer.LoadOptions{})
	if err != nil {
		panic(err)
	}
	chat := &tokenizer.Chat{
		Messages:            json.RawMessage(`[{"role": "user", "content": "What's the weather in Paris?"}]`),
		AddGenerationPrompt: true,
	}
	text, _ := m.RenderChat(chat)
	fmt.Printf("%q\n", text)
	ids, err := m.EncodeChat(nil, chat)
	fmt.Println(len(ids), "ids;", err)
	// Output:
	// "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
	// 62 ids; <nil>
}

func ExampleModel_EncodeRequest() {
	m, err := tokenizer.LoadModel("testdata/llama3", tokenizer.LoadOptions{})
	if err != nil {
		panic(err)
	}
	req, err := openai.ParseRequest([]byte(`{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`), openai.KindChat)
	if err != nil {
		panic(err)
	}
	ids, err := m.EncodeRequest(nil, req) // what the engine will see
	fmt.Println(len(ids), "ids;", err)
	// Output:
	// 59 ids; <nil>
}
