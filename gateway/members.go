package gateway

// members are the local subscribers of one Redis channel: a user's own
// channel has one or a few (its connections), a dialog's as many as its
// members connected here. Most channels are small, so the set is a slice
// (16 bytes a member, against a map's header and a group of eight slots for
// even one entry); a position index is added only while the list is long,
// so leaving a large channel does not scan it. Guarded by Hub.mu.
type members struct {
	// name is the channel, kept once: every subscription to it shares the
	// string (sub.channel).
	name string
	list []member
	at   map[*conn]int // c → its position in list; only above indexFrom members
}

// member is one connection on a channel; s is nil on the user's own
// channel.
type member struct {
	c *conn
	s *sub
}

// indexFrom is the list length above which members keeps an index; it is
// dropped again below half of it.
const indexFrom = 32

// add puts c on the channel with subscription s (replacing c's entry if
// it has one).
func (m *members) add(c *conn, s *sub) {
	if i := m.find(c); i >= 0 {
		m.list[i].s = s
		return
	}
	m.list = append(m.list, member{c, s})
	switch {
	case m.at != nil:
		m.at[c] = len(m.list) - 1
	case len(m.list) > indexFrom:
		m.at = make(map[*conn]int, len(m.list))
		for i, e := range m.list {
			m.at[e.c] = i
		}
	}
}

// find is c's position in list, or -1.
func (m *members) find(c *conn) int {
	if m.at != nil {
		if i, ok := m.at[c]; ok {
			return i
		}
		return -1
	}
	for i := range m.list {
		if m.list[i].c == c {
			return i
		}
	}
	return -1
}

// removeAt takes the member at i out; the last member moves into its
// place.
func (m *members) removeAt(i int) {
	last := len(m.list) - 1
	if m.at != nil {
		delete(m.at, m.list[i].c)
		if i != last {
			m.at[m.list[last].c] = i
		}
	}
	m.list[i] = m.list[last]
	m.list[last] = member{}
	m.list = m.list[:last]
	if m.at != nil && len(m.list) <= indexFrom/2 {
		m.at = nil
	}
	if len(m.list) == 0 {
		m.list = nil
	}
}
