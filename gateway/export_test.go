package gateway

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
