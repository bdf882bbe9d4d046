package gateway

import "sync"

// HoldHandshakeSlots takes n handshake admission slots of s, as n
// handshakes in the middle of their Redis and PostgreSQL work would, until
// the returned function gives them back. The slots must be free.
func (s *Service) HoldHandshakeSlots(n int) (release func()) {
	for range n {
		if err := s.hub.gate.acquire(nil); err != nil {
			panic("HoldHandshakeSlots: " + err.Error())
		}
	}
	return func() {
		for range n {
			s.hub.gate.release()
		}
	}
}

// HoldHubLock takes the hub's lock, as a long connect, subscribe or
// dispatch would, until the returned function gives it back.
func (s *Service) HoldHubLock() (release func()) {
	s.hub.mu.Lock()
	return s.hub.mu.Unlock
}

// HoldWrites keeps userID's one connection from writing, as a writer
// stuck on a client that takes nothing would, so what is delivered to it
// stays in its queue; the returned function lets a writer run again. ok is
// false while a writer runs (or the user has no connection): try again.
func (s *Service) HoldWrites(userID string) (release func(), ok bool) {
	h := s.hub
	h.mu.RLock()
	defer h.mu.RUnlock()
	for c := range h.conns {
		if c.userID != userID {
			continue
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.writing || c.closed {
			return nil, false
		}
		c.writing = true
		var once sync.Once
		return func() {
			once.Do(func() {
				c.mu.Lock()
				c.writing = false
				c.signal()
				c.mu.Unlock()
			})
		}, true
	}
	return nil, false
}
