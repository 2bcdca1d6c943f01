package tokenizer

// UnknownToRef exposes the table of characters the reference's normalizers
// do not know to the tests of tokenizer_test.
var UnknownToRef = unknownToRef

// IsLetter and IsNumber expose \p{L} and \p{N} as the pre-tokenizers'
// regular expressions match them.
var IsLetter, IsNumber = isL, isN
