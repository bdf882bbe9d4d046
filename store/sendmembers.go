package store

import (
	"github.com/han-app/gateway/internal/ids"
)

// maxKnownMembers bounds how many (dialog, member) pairs an instance's
// send combiner remembers (about 3 MB at most): past it, an arbitrary pair
// is forgotten for each new one. Only members enter it, so outsiders'
// sends, however many accounts they come from, never grow it.
const maxKnownMembers = 1 << 16

// unverifiedShare is the part of a dialog queue's bound (1/unverifiedShare
// of it, at least one send) that the sends of senders not known to be
// members of the dialog may hold together.
const unverifiedShare = 8

// knownMembers is the senders the combiner knows to be members of a dialog:
// their sends were written, or refused past the send statement's
// membership check (a duplicate, a bad attachment, a used idempotency key),
// or a membership read found them. A send the statement refuses as not a
// member's takes its sender out again, and so does a membership read that
// finds none. The set decides only which part of a dialog's queue a send
// may take (see sendCombiner), never whether it is written: the send
// statement checks membership for every send, so a pair remembered after
// the membership ended costs nothing but that. Guarded by the combiner's
// mutex.
type knownMembers map[[32]byte]struct{}

// memberKey is the set's key of (dialog, user); ok is false when either is
// no UUID (no such send is ever written, and none is remembered).
func memberKey(dialog, user string) (k [32]byte, ok bool) {
	d, dok := ids.Parse(dialog)
	u, uok := ids.Parse(user)
	copy(k[:16], d[:])
	copy(k[16:], u[:])
	return k, dok && uok
}

// has reports whether the key's user is known to be a member of its
// dialog.
func (m knownMembers) has(k [32]byte, ok bool) bool {
	if !ok {
		return false
	}
	_, known := m[k]
	return known
}

// set records whether the key's user is a member of its dialog.
func (m knownMembers) set(k [32]byte, member bool) {
	switch _, known := m[k]; {
	case !member:
		delete(m, k)
	case known:
	default:
		if len(m) >= maxKnownMembers {
			for old := range m {
				delete(m, old)
				break
			}
		}
		m[k] = struct{}{}
	}
}

// learnMember records what a membership read found about user in dialog.
func (c *sendCombiner) learnMember(dialog, user string, member bool) {
	k, ok := memberKey(dialog, user)
	if !ok {
		return
	}
	c.mu.Lock()
	c.known.set(k, member)
	c.mu.Unlock()
}

// learn records what the send statement's answers tell of the senders of a
// batch into dialog: not_member, that the sender is no member (or the
// dialog does not exist); any other outcome comes after the statement's
// membership check, so the sender is a member. It runs before the sends are
// answered, so a sender's next send already counts as a member's.
func (c *sendCombiner) learn(dialog string, batch []*sendReq, rows []sendRow) {
	type fact struct {
		k      [32]byte
		member bool
	}
	facts := make([]fact, 0, len(rows))
	for i := range rows {
		if o := int(rows[i].ord); o >= 1 && o <= len(batch) {
			if k, ok := memberKey(dialog, batch[o-1].in.SenderID); ok {
				facts = append(facts, fact{k, rows[i].outcome != "not_member"})
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range facts {
		c.known.set(f.k, f.member)
	}
}
