package render_test

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
)

func ExampleClient() {
	engine, err := fakeengine.Start(fakeengine.Config{ID: 1}) // a vLLM server in real use
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	c := &render.Client{URL: engine.URL()} // vLLM's /v1/chat/completions/render
	req, _ := openai.ParseRequest([]byte(`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],
	  "messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"https://example.invalid/x.png"}}]}]}`), openai.KindChat)
	ids, items, err := c.TokenizeMM(context.Background(), req, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(ids), "tokens;", len(items), "image at", items[0].Offset)
	fmt.Println(render.Probe(context.Background(), c, c, "m"))
	// Output:
	// 11 tokens; 1 image at 6
	// <nil>
}
