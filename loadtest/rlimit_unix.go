//go:build unix

package loadtest

import "syscall"

// RaiseFileLimit raises the soft RLIMIT_NOFILE to the hard limit (tens of
// thousands of sockets need as many descriptors) and returns the limit now
// in force.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return uint64(lim.Cur), nil
}
