// Package workers keeps a few goroutines that wait for the next job instead
// of exiting. A job whose work runs deep (go-redis's pipeline, a subscribe's
// checks) grows a fresh goroutine's stack from the minimum, copying it two or
// three times; a worker keeps its grown stack from one job to the next. It
// knows nothing of the jobs: the pool's function runs them.
package workers
