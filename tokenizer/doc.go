// Package tokenizer encodes text into token ids exactly as a Hugging Face
// tokenizer.json does, and renders chats with the model's chat template.
//
// # Usage
//
// Load a tokenizer.json with FromFile (or Parse), then call Encode from
// any goroutine:
//
//	tok, err := tokenizer.FromFile("/models/llama/tokenizer.json")
//	if err != nil {
//		return err // wraps ErrUnsupported for options not implemented
//	}
//	ids := tok.Encode(nil, "Hello world", true) // with the BOS token
//
// # What is supported
//
// The families in common use, each checked id for id against the Python
// tokenizers library on a fixed corpus (testdata/*/golden.json):
//
//   - byte-level BPE (GPT-2, Llama 3, Qwen 2 and the like): the ByteLevel
//     pre-tokenizer, Split with the GPT-2, Llama 3 (cl100k) or Qwen 2
//     regular expression, ignore_merges, the NFC/NFD/NFKC/NFKD normalizers;
//   - SentencePiece-style BPE (Llama 2, Mistral): Metaspace with every
//     prepend scheme, or the Prepend and Replace normalizers, byte
//     fallback, fused unknown tokens;
//   - Unigram (T5, ALBERT and the like) with byte fallback;
//   - added tokens (special or not, lstrip, rstrip, normalized or not) and
//     the TemplateProcessing post-processor.
//
// Unicode follows the reference's tables rather than Go's where they
// differ: the normalizers leave whole the characters Hugging Face's older
// normalization tables do not know, and the pre-tokenizers' \p{L} and
// \p{N} include the Unicode 16 letters and numbers its regular
// expressions match (both checked code point by code point against the
// Python reference). Ill-formed UTF-8 reads as Python and Rust read it.
//
// Anything else (other regular expressions, WordPiece, Lowercase, single
// word added tokens, truncation, dropout, ...) is refused at load with an
// error wrapping ErrUnsupported, never approximated: ids that differ from
// the engine's match nothing in its KV cache.
package tokenizer
