package store

import (
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

// The members a send combiner remembers are bounded (maxKnownMembers): past
// the bound each new member takes the place of an arbitrary one, and the
// newest is always remembered.
func TestKnownMembersAreBounded(t *testing.T) {
	m := knownMembers{}
	dialog := ids.New()
	for range maxKnownMembers + 100 {
		k, ok := memberKey(dialog, ids.New())
		m.set(k, true)
		if !m.has(k, ok) {
			t.Fatalf("the member just recorded is not known (%d remembered)", len(m))
		}
	}
	if len(m) != maxKnownMembers {
		t.Fatalf("%d members remembered, want %d", len(m), maxKnownMembers)
	}
	if m.has(memberKey(dialog, "not-a-uuid")) {
		t.Fatal("a sender that is no UUID is known")
	}
}
