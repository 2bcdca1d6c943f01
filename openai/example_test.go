package openai_test

import (
	"fmt"

	"github.com/kvroute/kvroute/openai"
)

func ExampleParseRequest() {
	body := []byte(`{"model":"m","stream":true,"cache_salt":"tenant-a",
	 "tools":[{"type":"function","function":{"name":"search"}}],
	 "messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:,"}}]}]}`)
	kind, _ := openai.KindOfPath("/v1/chat/completions")
	req, err := openai.ParseRequest(body, kind)
	if err != nil {
		panic(err)
	}
	msgs, _ := req.TextMessages()
	fmt.Println(req.Model, req.Stream, req.CacheSalt, len(req.Tools) > 0, msgs[0].Content)
	// Output: m true tenant-a true hi
}

func ExampleEventScanner() {
	var s openai.EventScanner
	for _, chunk := range []string{"data: {\"choices\":[{\"text\":\"a\"}]}\n", "\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n"} {
		s.Write([]byte(chunk), func(ev *openai.Event) {
			switch {
			case ev.Done:
				fmt.Println("done")
			case ev.HasUsage:
				fmt.Println("cached", ev.Usage.CachedTokens, "of", ev.Usage.PromptTokens)
			default:
				fmt.Println("chunk")
			}
		})
	}
	// Output:
	// chunk
	// cached 32 of 40
	// done
}
