package store

// SendQueueDepth is how many sends into the dialog this instance holds,
// waiting and being written (tests order sends through it).
func (s *Store) SendQueueDepth(dialogID string) int {
	c := s.sends
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queues[dialogID]
	if q == nil {
		return 0
	}
	return len(q.waiting) + q.inFlight
}

// SendGroupWaiting is how many dialogs' batches wait for a free send
// transaction.
func (s *Store) SendGroupWaiting() int {
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	return len(s.groups.waiting)
}
