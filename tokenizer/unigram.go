package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"
)

// unigram is the Unigram model of Hugging Face tokenizers (SentencePiece's
// unigram): the segmentation of highest total score (Viterbi), unknown
// characters scored below every piece and fused into runs, optionally
// spelled as <0xXX> byte tokens.
type unigram struct {
	pieces       []unigramPiece
	ids          map[string]uint32
	nodes        []trieNode
	unk          uint32
	unkScore     float64
	byteFallback bool
	byteTokens   [256]int64
	cache        cache
}

type unigramPiece struct {
	text  string
	score float64
}

// trieNode is a node of the byte trie of the pieces.
type trieNode struct {
	next map[byte]int32
	id   int32 // -1: no piece ends here
}

// unkPenalty is how far below the lowest piece an unknown character scores.
const unkPenalty = 10.0

func parseUnigram(raw json.RawMessage) (*unigram, error) {
	var v struct {
		Type         string            `json:"type"`
		UnkID        *int              `json:"unk_id"`
		Vocab        []json.RawMessage `json:"vocab"`
		ByteFallback bool              `json:"byte_fallback"`
	}
	if err := strict("model Unigram", raw, &v); err != nil {
		return nil, err
	}
	if len(v.Vocab) == 0 {
		return nil, fmt.Errorf("%w: Unigram with an empty vocab", ErrInvalid)
	}
	if v.UnkID == nil || *v.UnkID < 0 || *v.UnkID >= len(v.Vocab) {
		return nil, fmt.Errorf("%w: Unigram without a valid unk_id", ErrUnsupported)
	}
	m := &unigram{ids: make(map[string]uint32, len(v.Vocab)), unk: uint32(*v.UnkID), byteFallback: v.ByteFallback}
	m.nodes = []trieNode{{id: -1}}
	minScore := math.Inf(1)
	for id, r := range v.Vocab {
		var pair []any
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("%w: Unigram vocab entry %s", ErrInvalid, r)
		}
		text, ok1 := pair[0].(string)
		score, ok2 := pair[1].(float64)
		if !ok1 || !ok2 || text == "" {
			return nil, fmt.Errorf("%w: Unigram vocab entry %s", ErrInvalid, r)
		}
		m.pieces = append(m.pieces, unigramPiece{text, score})
		m.ids[text] = uint32(id)
		minScore = min(minScore, score)
		n := int32(0)
		for i := 0; i < len(text); i++ {
			c, ok := m.nodes[n].next[text[i]]
			if !ok {
				c = int32(len(m.nodes))
				m.nodes = append(m.nodes, trieNode{id: -1})
				if m.nodes[n].next == nil {
					m.nodes[n].next = make(map[byte]int32)
				}
				m.nodes[n].next[text[i]] = c
			}
			n = c
		}
		m.nodes[n].id = int32(id)
	}
	m.unkScore = minScore - unkPenalty
	for b := range 256 {
		m.byteTokens[b] = -1
		if id, ok := m.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteTokens[b] = int64(id)
		}
	}
	return m, nil
}

type bestPath struct {
	score float64
	start int // -1: not reached
	id    uint32
	isUnk bool
}

func (m *unigram) tokenize(dst []uint32, s string) []uint32 {
	if ids, ok := m.cache.get(s); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = m.viterbi(dst, s)
	m.cache.put(s, dst[start:])
	return dst
}

func (m *unigram) viterbi(dst []uint32, s string) []uint32 {
	best := make([]bestPath, len(s)+1)
	for i := range best {
		best[i].start = -1
	}
	for at := 0; at < len(s); {
		here := best[at].score
		_, mblen := utf8.DecodeRuneInString(s[at:])
		single := false
		n := int32(0)
		for k := at; k < len(s); k++ {
			c, ok := m.nodes[n].next[s[k]]
			if !ok {
				break
			}
			n = c
			if id := m.nodes[n].id; id >= 0 {
				end := k + 1
				cand := m.pieces[id].score + here
				if t := &best[end]; t.start < 0 || cand > t.score {
					*t = bestPath{score: cand, start: at, id: uint32(id)}
				}
				if end-at == mblen {
					single = true
				}
			}
		}
		if !single {
			cand := m.unkScore + here
			if t := &best[at+mblen]; t.start < 0 || cand > t.score {
				*t = bestPath{score: cand, start: at, id: m.unk, isUnk: true}
			}
		}
		at += mblen
	}
	// Walk back, fusing runs of unknown characters.
	type span struct {
		start, end int
		id         uint32
		unk        bool
	}
	var spans []span
	for end := len(s); end > 0; {
		b := best[end]
		if b.isUnk || b.id == m.unk {
			if k := len(spans) - 1; k >= 0 && spans[k].unk && spans[k].start == end {
				spans[k].start = b.start
			} else {
				spans = append(spans, span{b.start, end, m.unk, true})
			}
		} else {
			spans = append(spans, span{b.start, end, b.id, false})
		}
		end = b.start
	}
	for k := len(spans) - 1; k >= 0; k-- {
		sp := spans[k]
		if !sp.unk {
			dst = append(dst, sp.id)
			continue
		}
		text := s[sp.start:sp.end]
		if id, ok := m.ids[text]; ok {
			dst = append(dst, id)
			continue
		}
		if m.byteFallback {
			all := true
			for i := 0; i < len(text); i++ {
				all = all && m.byteTokens[text[i]] >= 0
			}
			if all {
				for i := 0; i < len(text); i++ {
					dst = append(dst, uint32(m.byteTokens[text[i]]))
				}
				continue
			}
		}
		dst = append(dst, m.unk)
	}
	return dst
}
