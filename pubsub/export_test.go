package pubsub

// HoldLock takes the subscriber's lock, as a publish or a subscribe holds
// it, until the returned function gives it back.
func (s *Subscriber) HoldLock() (release func()) {
	s.mu.Lock()
	return s.mu.Unlock
}
