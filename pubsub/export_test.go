package pubsub

// HoldLock takes the subscriber's lock, as a publish or a subscribe holds
// it, until the returned function gives it back.
func (s *Subscriber) HoldLock() (release func()) {
	s.mu.Lock()
	return s.mu.Unlock
}

// Waiters is how many Subscribe calls wait for channel's confirmation.
func (s *Subscriber) Waiters(channel string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.chans[channel]; st != nil {
		return len(st.waiters)
	}
	return 0
}
