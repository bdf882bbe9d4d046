//go:build !unix

package loadtest

// RaiseFileLimit is a no-op where RLIMIT_NOFILE does not exist; 0 means
// unknown.
func RaiseFileLimit() (uint64, error) { return 0, nil }
