package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// Tokenizer turns text into token ids as a Hugging Face tokenizer.json
// describes, reproducing the ids of the tokenizers library exactly for
// the options it accepts (see the package documentation). It is
// immutable after loading and safe for concurrent use.
type Tokenizer struct {
	added      []*addedToken
	raw        *matchSet // added tokens matched on the raw text
	normed     *matchSet // added tokens matched on normalized text
	normalizer normalizer
	pre        preTokenizer
	firstOnly  bool // a Metaspace pre-tokenizer prepends to the first piece only
	model      model
	post       *affix
	decoder    []decoder
	idToToken  map[uint32]string
	decodeAs   map[uint32]string // normalized added tokens decode as normalized
	special    map[uint32]bool
	skipText   map[string]bool // the contents of the special added tokens
	tokenToID  map[string]uint32
}

// model is the last step of encoding: one pre-tokenized piece to ids.
type model interface {
	tokenize(dst []uint32, s string) []uint32
}

// FromFile loads a tokenizer.json file. Errors wrap ErrInvalid,
// ErrUnsupported or the file system's error.
func FromFile(path string) (*Tokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return Parse(b)
}

// Parse loads a tokenizer from the contents of a tokenizer.json file.
// Options this package does not implement are refused with an error
// wrapping ErrUnsupported; malformed files give one wrapping ErrInvalid.
// Added tokens take the ids tokenizers gives them at load, whatever ids
// the file writes (the two agree in files tokenizers saved): a token of the
// model's vocab keeps its vocab id, any other takes the next free id.
func Parse(data []byte) (*Tokenizer, error) {
	var spec fileSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !isNull(spec.Truncation) {
		return nil, fmt.Errorf("%w: truncation", ErrUnsupported)
	}
	if !isNull(spec.Padding) {
		return nil, fmt.Errorf("%w: padding", ErrUnsupported)
	}
	if isNull(spec.Model) {
		return nil, fmt.Errorf("%w: no model", ErrInvalid)
	}
	t := &Tokenizer{idToToken: make(map[uint32]string), decodeAs: make(map[uint32]string), special: make(map[uint32]bool), skipText: make(map[string]bool), tokenToID: make(map[string]uint32)}
	var err error
	if t.normalizer, err = parseNormalizer(spec.Normalizer); err != nil {
		return nil, err
	}
	var byteLevel bool
	if t.pre, byteLevel, err = parsePreTokenizer(spec.PreTokenizer); err != nil {
		return nil, err
	}
	t.firstOnly = prependsFirstOnly(t.pre)
	var vocab map[string]uint32 // the model's tokens
	var vocabSize int
	typ, err := componentType("model", spec.Model)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "BPE":
		m, err := parseBPE(spec.Model, byteLevel)
		if err != nil {
			return nil, err
		}
		t.model = m
		vocab, vocabSize = m.vocab, len(m.vocab)
		for tok, id := range m.vocab {
			t.idToToken[id] = tok
			t.tokenToID[tok] = id
		}
	case "Unigram":
		if byteLevel {
			return nil, fmt.Errorf("%w: Unigram with a ByteLevel pre-tokenizer", ErrUnsupported)
		}
		m, err := parseUnigram(spec.Model)
		if err != nil {
			return nil, err
		}
		t.model = m
		vocab, vocabSize = m.ids, len(m.pieces)
		for id, p := range m.pieces {
			t.idToToken[uint32(id)] = p.text
			t.tokenToID[p.text] = uint32(id)
		}
	default:
		return nil, fmt.Errorf("%w: model %q", ErrUnsupported, typ)
	}
	var rawTokens, normTokens []*addedToken
	ids := addedIDs{vocab: vocab, size: int64(vocabSize), max: -1, seen: make(map[string]addedSpec)}
	for _, a := range spec.AddedTokens {
		if a.ID == nil || *a.ID < 0 || *a.ID > maxID {
			return nil, fmt.Errorf("%w: added token %q without a valid id", ErrInvalid, a.Content)
		}
		if a.SingleWord {
			return nil, fmt.Errorf("%w: added token %q with single_word", ErrUnsupported, a.Content)
		}
		id, ok, err := ids.assign(a)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		at := &addedToken{content: a.Content, id: id, lstrip: a.LStrip, rstrip: a.RStrip, special: a.Special}
		t.added = append(t.added, at)
		t.idToToken[at.id] = at.content
		t.tokenToID[at.content] = at.id
		if a.Special {
			t.special[at.id] = true
			t.skipText[at.content] = true
		}
		if a.Normalized && t.normalizer != nil {
			n := *at
			n.content = t.normalizer.normalize(at.content)
			if n.content == "" {
				// tokenizers matches the empty text at every position.
				return nil, fmt.Errorf("%w: added token %q is normalized to nothing", ErrUnsupported, a.Content)
			}
			normTokens = append(normTokens, &n)
			t.decodeAs[at.id] = n.content
		} else if a.Normalized {
			normTokens = append(normTokens, at)
		} else {
			rawTokens = append(rawTokens, at)
		}
	}
	t.raw, t.normed = newMatchSet(rawTokens), newMatchSet(normTokens)
	if t.post, err = parsePostProcessor(spec.PostProcessor); err != nil {
		return nil, err
	}
	if t.decoder, err = parseDecoder(spec.Decoder); err != nil {
		return nil, err
	}
	return t, nil
}

// addedIDs gives added tokens their ids as Hugging Face tokenizers does
// when it loads a tokenizer.json, whatever ids the file writes: a token of
// the model's vocab keeps its id there, any other takes the next id after
// the vocab and the added tokens before it.
type addedIDs struct {
	vocab map[string]uint32
	size  int64 // the model's vocab size
	max   int64 // the largest id given to an added token, -1 for none
	seen  map[string]addedSpec
}

// assign returns the id of a, or false when a is to be skipped: empty, or
// listed before with the same options. A token listed twice with
// different options is refused: tokenizers gives it the options of its
// last entry for matching but keeps the first entry's order.
func (d *addedIDs) assign(a addedSpec) (uint32, bool, error) {
	if a.Content == "" {
		return 0, false, nil
	}
	if prev, ok := d.seen[a.Content]; ok {
		a.ID, prev.ID = nil, nil
		if prev != a {
			return 0, false, fmt.Errorf("%w: added token %q listed twice with different options", ErrUnsupported, a.Content)
		}
		return 0, false, nil
	}
	d.seen[a.Content] = a
	id, ok := d.vocab[a.Content]
	if !ok {
		next := d.size
		if d.max >= d.size || d.size == 0 {
			next = d.max + 1
		}
		if next > maxID {
			return 0, false, fmt.Errorf("%w: added token %q would have id %d", ErrInvalid, a.Content, next)
		}
		id = uint32(next)
	}
	d.max = max(d.max, int64(id))
	return id, true, nil
}

// encodeBuf holds the pieces of one Encode call, pooled.
type encodeBuf struct {
	segs, subs []segment
	pieces     []piece
}

var encodePool = sync.Pool{New: func() any { return new(encodeBuf) }}

// Encode appends the ids of text to dst and returns the extended slice.
// With addSpecialTokens the post-processor's special tokens are added (a
// leading BOS for Llama-style files), as tokenizers' encode does by
// default; chat templates write their special tokens themselves and are
// encoded without. Added tokens in text (such as "<|im_start|>") are
// always recognised. Ill-formed UTF-8 is read as Python's
// bytes.decode(errors="replace") and Rust's String::from_utf8_lossy read
// it: one U+FFFD for each maximal subpart (a character cut short is one
// U+FFFD, not one per byte).
func (t *Tokenizer) Encode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	if t.post == nil || !addSpecialTokens {
		return t.encode(dst, text)
	}
	dst = append(dst, t.post.before...)
	dst = t.encode(dst, text)
	return append(dst, t.post.after...)
}

func (t *Tokenizer) encode(dst []uint32, text string) []uint32 {
	text = validUTF8(text)
	buf := encodePool.Get().(*encodeBuf)
	defer encodePool.Put(buf)
	lead := 0 // where the text starts is followed only when it matters
	if t.firstOnly {
		lead = firstRuneLen(text)
	}
	buf.segs = t.raw.split(buf.segs[:0], text, lead)
	for _, sg := range buf.segs {
		if sg.tok != nil {
			dst = append(dst, sg.tok.id)
			continue
		}
		s, lead := sg.text, sg.lead
		if t.normalizer != nil {
			if lead > 0 {
				s, lead = t.normalizer.normalizeLead(s, lead)
			} else {
				s = t.normalizer.normalize(s)
			}
		}
		buf.subs = t.normed.split(buf.subs[:0], s, lead)
		for _, sub := range buf.subs {
			if sub.tok != nil {
				dst = append(dst, sub.tok.id)
				continue
			}
			buf.pieces = buf.pieces[:0]
			if t.pre != nil {
				buf.pieces = t.pre.split(buf.pieces, piece{sub.text, sub.lead})
			} else {
				buf.pieces = append(buf.pieces, piece{sub.text, sub.lead})
			}
			for _, p := range buf.pieces {
				if p.s != "" {
					dst = t.model.tokenize(dst, p.s)
				}
			}
		}
	}
	return dst
}

// prependsFirstOnly reports whether p has a Metaspace pre-tokenizer with
// the "first" prepend scheme.
func prependsFirstOnly(p preTokenizer) bool {
	switch p := p.(type) {
	case metaspace:
		return p.scheme == "first"
	case preTokenizerSeq:
		for _, q := range p {
			if prependsFirstOnly(q) {
				return true
			}
		}
	}
	return false
}

// TokenID returns the id of a token of the vocabulary or of the added
// tokens, and whether there is one.
func (t *Tokenizer) TokenID(token string) (uint32, bool) {
	id, ok := t.tokenToID[token]
	return id, ok
}

// Token returns the text of a token id as the vocabulary writes it (in the
// byte-level alphabet for byte-level models; normalized for an added token
// matched on normalized text, as tokenizers' id_to_token gives it), and
// whether there is one.
func (t *Tokenizer) Token(id uint32) (string, bool) {
	if s, ok := t.decodeAs[id]; ok {
		return s, true
	}
	s, ok := t.idToToken[id]
	return s, ok
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id uint32) bool { return t.special[id] }

// VocabSize returns the number of distinct ids: the model's vocabulary and
// the added tokens.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }
