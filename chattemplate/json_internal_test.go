package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"strconv"
	"testing"
)

// referenceFromJSON decodes JSON into template values with encoding/json's
// token stream, the semantics fromJSON keeps (duplicate keys accepted,
// the last one winning; invalid UTF-8 and lone surrogates replaced with
// U+FFFD; integers as int64 when they fit, else as their digits;
// other numbers as float64, ±Inf beyond its range), and refuses anything but white space after the value. It is the
// oracle of FuzzFromJSON, whose seeds every test run checks.
func referenceFromJSON(data []byte) (value, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := referenceDecode(d, 0)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimLeft(data[d.InputOffset():], " \t\r\n")) > 0 {
		return nil, errors.New("trailing data")
	}
	return v, nil
}

func referenceDecode(d *json.Decoder, depth int) (value, error) {
	if depth > maxDepth {
		return nil, errors.New("too deep")
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '[':
			l := &list{}
			for d.More() {
				v, err := referenceDecode(d, depth+1)
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, v)
			}
			_, err := d.Token()
			return l, err
		case '{':
			m := newDict()
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := referenceDecode(d, depth+1)
				if err != nil {
					return nil, err
				}
				m.set(k.(string), v)
			}
			_, err := d.Token()
			return m, err
		}
		return nil, errors.New("unexpected delimiter")
	case json.Number:
		i, err := strconv.ParseInt(string(t), 10, 64)
		if err == nil {
			return i, nil
		}
		if b, ok := new(big.Int).SetString(string(t), 10); ok {
			return bigInt(b.String()), nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, err
		}
		return f, nil
	case string, bool, nil:
		return t, nil
	}
	return nil, errors.New("unexpected token")
}

// jsonSeeds are inputs on which a JSON decoder's semantics differ easily.
var jsonSeeds = []string{
	`[{"role":"user","content":"hi"}]`,
	`{"a":1,"b":[true,false,null],"c":{"d":"e"}}`,
	`{"a":1,"a":2,"b":3,"a":4}`,
	` [ 1 , 2.5 , -0 , 1e400 , -1e400 , 9223372036854775807 , 9223372036854775808 , 1E-400 ] `,
	`[-9223372036854775808, -9223372036854775809, 100000000000000000000000000000, 1e19, 10000000000000000000.0, -0]`,
	`"\u00e9\ud83d\ude00 \ud800 \udc00x \u0000"`,
	"\"\xff\xfe invalid \xc3\x28 utf-8\"",
	"{\"k\xff\":\"v\"}",
	`[]`, `{}`, `""`, `null`, `true`, `0`,
	`[1,]`, `{"a":}`, `{"a" 1}`, `[1] [2]`, `[1] x`, `01`, `1.`, `.5`, `+1`, `NaN`, `"\x"`, `[`, `{"a":1`, ``, ` `,
	"\"tab\there\"", `"\/\b\f\n\r\t\"\\"`,
	`{"":{"":[[[[]]]]}}`,
}

// FuzzFromJSON: fromJSON and encoding/json's token stream accept the same
// inputs and decode them to the same values.
func FuzzFromJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkFromJSON)
}

func checkFromJSON(t *testing.T, data []byte) {
	t.Helper()
	want, wantErr := referenceFromJSON(data)
	got, err := fromJSON(data)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", data, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decoded %#v, encoding/json %#v", data, got, want)
	}
}
