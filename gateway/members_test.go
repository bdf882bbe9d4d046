package gateway

import "testing"

// members keeps one entry per connection through the switch to an index
// and back, whatever order connections leave in.
func TestMembersAddFindRemove(t *testing.T) {
	m := &members{name: "ch"}
	conns := make([]*conn, 3*indexFrom)
	for i := range conns {
		conns[i] = &conn{}
		m.add(conns[i], nil)
		if m.find(conns[i]) != i {
			t.Fatalf("conn %d not found at its position", i)
		}
	}
	if m.at == nil {
		t.Fatalf("no index with %d members", len(m.list))
	}
	s := &sub{channel: "ch"}
	m.add(conns[5], s) // replaces, does not add
	if len(m.list) != len(conns) || m.list[m.find(conns[5])].s != s {
		t.Fatalf("re-adding a member: %d members, sub %v", len(m.list), m.list[m.find(conns[5])].s)
	}
	for i := 0; i < len(conns); i += 2 { // every other one, then the rest
		m.removeAt(m.find(conns[i]))
	}
	for i := 1; i < len(conns); i += 2 {
		if m.find(conns[i]) < 0 {
			t.Fatalf("conn %d lost", i)
		}
		m.removeAt(m.find(conns[i]))
		if m.find(conns[i]) >= 0 {
			t.Fatalf("conn %d still found after removal", i)
		}
	}
	if len(m.list) != 0 || m.at != nil || m.list != nil {
		t.Fatalf("after removing all: %d members, index %v", len(m.list), m.at != nil)
	}
}
