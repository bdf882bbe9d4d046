package ids

import (
	"strings"
	"testing"
)

func TestNewIsAVersion7UUID(t *testing.T) {
	seen := map[string]bool{}
	prev := ""
	for i := 0; i < 1000; i++ {
		id := New()
		c, ok := Canonical(id)
		if !ok || c != id {
			t.Fatalf("New() = %q is not a canonical UUID", id)
		}
		if id[14] != '7' || !strings.ContainsRune("89ab", rune(id[19])) {
			t.Fatalf("%s: want version 7, RFC 4122 variant", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
		// The 48-bit millisecond prefix never goes backwards.
		if prev != "" && id[:13] < prev[:13] {
			t.Fatalf("time prefix went backwards: %s after %s", id, prev)
		}
		prev = id
	}
}

func TestCanonical(t *testing.T) {
	cases := map[string]string{
		"01A22B33-FD99-79A2-8E3E-C3F2BDC645C0": "01a22b33-fd99-79a2-8e3e-c3f2bdc645c0",
		"00000000-0000-7000-8000-00000000a11c": "00000000-0000-7000-8000-00000000a11c",
	}
	for in, want := range cases {
		if got, ok := Canonical(in); !ok || got != want {
			t.Errorf("Canonical(%q) = %q %v", in, got, ok)
		}
	}
	for _, bad := range []string{"", "nope", "01a22b33fd9979a28e3ec3f2bdc645c0", "01a22b33-fd99-79a2-8e3e-c3f2bdc645cg",
		"01a22b33-fd99-79a2-8e3ec-3f2bdc645c0", "{01a22b33-fd99-79a2-8e3e-c3f2bdc645c0}"} {
		if Valid(bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
}
