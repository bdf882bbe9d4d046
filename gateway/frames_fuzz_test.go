package gateway

import (
	stdjson "encoding/json"
	"testing"

	"github.com/han-app/gateway/internal/jsonx"
)

// FuzzParseInFrame feeds arbitrary client WebSocket frames to the decoder:
// it never panics, accepts only strict JSON objects with a type, and what
// it accepts survives an encode/decode round trip unchanged.
func FuzzParseInFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"subscribe","dialogId":"01890a5d-ac96-774b-bcce-b302099a8057"}`,
		`{"type":"unsubscribe","dialogId":"x"}`, `{"type":"ping"}`, `{"type":"typing","dialogId":"d"}`,
		`{"type":"pong"}`, `{"type":""}`, `{}`, `[]`, `null`, `"subscribe"`, `{"type":"a","type":"b"}`,
		`{"type":"\ud800"}`, "{\"type\":\"\xff\"}", `{"type":"ping","extra":{"deep":[1,2,{"x":null}]}}`,
		`{"type":1}`, `{"type":"ping"} trailing`, `{"type":"ping"`, ``,
		`{"type":"subscribe","dialogId":"d","sinceSeq":12}`, `{"type":"subscribe","sinceSeq":-1}`,
		`{"type":"subscribe","sinceSeq":null}`, `{"type":"subscribe","sinceSeq":1e3}`, `{"type":"subscribe","sinceSeq":"3"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fr, ok := parseInFrame(in)
		if !ok {
			if fr != (inFrame{}) {
				t.Fatalf("%q: refused but returned %+v", in, fr)
			}
			return
		}
		if fr.Type == "" {
			t.Fatalf("%q: accepted without a type", in)
		}
		if err := jsonx.Check(in); err != nil {
			t.Fatalf("%q: accepted input the strict checker refuses: %v", in, err)
		}
		if !stdjson.Valid(in) {
			t.Fatalf("%q: accepted invalid JSON", in)
		}
		again, err := stdjson.Marshal(fr)
		if err != nil {
			t.Fatal(err)
		}
		fr2, ok := parseInFrame(again)
		if !ok || fr2 != fr {
			t.Fatalf("%q: round trip %s gave %+v %v, want %+v", in, again, fr2, ok, fr)
		}
	})
}
