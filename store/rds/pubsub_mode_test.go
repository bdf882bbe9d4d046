package rds_test

import (
	"testing"

	"github.com/han-app/gateway/store/rds"
)

// The mode names an operator writes, and nothing else.
func TestParsePubSubMode(t *testing.T) {
	for in, want := range map[string]rds.PubSubMode{"": rds.PubSubAuto, "auto": rds.PubSubAuto, "sharded": rds.PubSubSharded, "classic": rds.PubSubClassic} {
		got, err := rds.ParsePubSubMode(in)
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
		if in != "" && got.String() != in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, in := range []string{"Auto", "spublish", "classic "} {
		if _, err := rds.ParsePubSubMode(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}
