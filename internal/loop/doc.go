// Package loop runs one function in a background goroutine on a ticker:
// the shape shared by the idempotency janitor, the stuck-task recoverer,
// the settings refresher, the Redis health prober, and the queues that
// run only while they hold work (abandoned idempotency tokens, presence
// registrations to remove again).
//
// A Loop is built stopped. Start launches its goroutine; Close stops it,
// cancels the context of a run in progress and waits for that run to end.
// Start after Close does nothing, Close before Start returns at once, and
// both may be called any number of times from any goroutine.
//
// The function reports whether the loop should go on. A loop whose function
// said stop ends its goroutine and may be started again; a Start that races
// with that decision is not lost: the loop runs the function again instead
// of ending, so a caller that changed state and then called Start always
// sees a run that began after its Start.
package loop
