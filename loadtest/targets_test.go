package loadtest

import (
	"reflect"
	"testing"
)

func TestSplitTargets(t *testing.T) {
	for in, want := range map[string][]string{
		"http://127.0.0.1:8080":                          {"http://127.0.0.1:8080"},
		"http://127.0.0.1:8080,http://127.0.0.1:8081":    {"http://127.0.0.1:8080", "http://127.0.0.1:8081"},
		" http://127.0.0.1:8080 , http://localhost:8081": {"http://127.0.0.1:8080", "http://localhost:8081"},
		"baseline-inprocess":                             {"baseline-inprocess"},
	} {
		got, err := SplitTargets(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("SplitTargets(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "http://127.0.0.1:8080,", ",http://127.0.0.1:8080", "a,,b"} {
		if got, err := SplitTargets(bad); err == nil {
			t.Errorf("SplitTargets(%q) = %q, want an error", bad, got)
		}
	}
}

// A socket's per-target label is the http base of the URL it dialled, so
// it matches the REST client's label for the same gateway.
func TestTargetLabel(t *testing.T) {
	for in, want := range map[string]string{
		"ws://127.0.0.1:8081/v1/realtime?ticket=x": "http://127.0.0.1:8081",
		"wss://localhost:8443/v1/realtime":         "https://localhost:8443",
		"http://127.0.0.1:8080":                    "http://127.0.0.1:8080",
	} {
		if got := targetLabel(in); got != want {
			t.Errorf("targetLabel(%q) = %q, want %q", in, got, want)
		}
	}
}
