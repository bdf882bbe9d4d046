package legacystub

// SetAfterLease installs a hook that runs while r holds a task's lease.
func SetAfterLease(r *Recoverer, f func(taskID string)) { r.afterLease = f }
