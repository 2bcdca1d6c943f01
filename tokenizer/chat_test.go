package tokenizer_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/chattemplate"
	"github.com/kvroute/kvroute/tokenizer"
)

type rawChat struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Kwargs              json.RawMessage `json:"kwargs"`
	Text                string          `json:"text"`
	IDs                 []uint32        `json:"ids"`
	Error               string          `json:"error"`
}

func (c *rawChat) chat() *tokenizer.Chat {
	return &tokenizer.Chat{Messages: c.Messages, Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt, Kwargs: c.Kwargs}
}

func readRawChats(t testing.TB, family string) []rawChat {
	t.Helper()
	var g struct {
		Chats []rawChat `json:"chats"`
	}
	b := readFile(t, filepath.Join("testdata", family, "golden.json"))
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g.Chats
}

// checkChat compares one rendering with the reference: the same text and
// ids, or an error where transformers raised one (the template's own
// raise_exception message when it raised).
func checkChat(t *testing.T, m *tokenizer.Model, c *rawChat) {
	t.Helper()
	text, err := m.RenderChat(c.chat())
	if c.Error != "" {
		if err == nil {
			t.Errorf("messages %s: rendered %q, want error %q", c.Messages, text, c.Error)
			return
		}
		var raised *chattemplate.RaisedError
		if strings.HasPrefix(c.Error, "TemplateError: ") && (!errors.As(err, &raised) || raised.Message != strings.TrimPrefix(c.Error, "TemplateError: ")) {
			t.Errorf("messages %s: error %v, want %q", c.Messages, err, c.Error)
		}
		return
	}
	if err != nil {
		t.Errorf("messages %s: %v", c.Messages, err)
		return
	}
	if text != c.Text {
		t.Errorf("messages %s:\nrendered %q\nwant     %q", c.Messages, text, c.Text)
	}
	ids, err := m.EncodeChat(nil, c.chat())
	if err != nil || !slices.Equal(ids, c.IDs) {
		t.Errorf("messages %s: ids %v (err %v), want %v", c.Messages, ids, err, c.IDs)
	}
}

// TestChatGolden checks rendered chats and their ids against transformers'
// apply_chat_template.
func TestChatGolden(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			m, err := tokenizer.LoadModel(filepath.Join("testdata", fam), tokenizer.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			chats := readRawChats(t, fam)
			if len(chats) < 5 {
				t.Fatalf("only %d golden chats", len(chats))
			}
			for i := range chats {
				checkChat(t, m, &chats[i])
			}
		})
	}
}
