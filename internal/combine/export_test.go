package combine

// Queued is how many calls wait in c's queue now.
func (c *Combiner[C]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}
