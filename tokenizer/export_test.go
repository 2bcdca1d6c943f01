package tokenizer

// UnknownToRef exposes the table of characters the reference's normalizers
// do not know to the tests of tokenizer_test.
var UnknownToRef = unknownToRef
