package store

import (
	"errors"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// DefaultBlobCallTimeout is how long one file-system call of LocalBlobs
// (a write of up to 32 KiB, a sync, a rename, an open, a read) may take
// before the folder is taken for stalled. A healthy disk answers in
// milliseconds, a busy one syncs a large blob in seconds; a folder on a
// network file system whose server went silent never answers, and every
// request that touched it would hang with its client, its blob slot and
// an operating-system thread until the process ends.
const DefaultBlobCallTimeout = 30 * time.Second

// maxStalledBlobCalls is the most calls of one LocalBlobs that may be
// left stalled (still blocked in the kernel after their bound) before
// every further call fails at once without touching the folder: each one
// holds an operating-system thread, and a stalled folder would otherwise
// take a thread per request until the process hits its thread limit and
// dies. Calls go to the folder again as soon as stalled ones return.
const maxStalledBlobCalls = 8

// errBlobStalled is the cause of a call that did not return within its
// bound, or was not made because too many are stalled already. blobError
// classifies it as ErrBlobStoreUnavailable.
var errBlobStalled = errors.New("store: blob folder stalled")

// stallGuard bounds the file-system calls of one LocalBlobs.
type stallGuard struct {
	timeout time.Duration
	stalled atomic.Int32 // calls that passed their bound and have not returned
}

// do runs fn and returns its error, or errBlobStalled once fn has run for
// the guard's timeout (or at once when maxStalledBlobCalls are stalled).
// fn is then left to finish on its own goroutine, and undo, when not nil,
// is called once it has succeeded, to release what it made (a descriptor
// nobody will close otherwise). fn must not touch memory its caller may
// reuse after do returns: what it reads or writes is its own.
func (g *stallGuard) do(fn func() error, undo func()) error {
	if g.stalled.Load() >= maxStalledBlobCalls {
		return errBlobStalled
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	g.stalled.Add(1)
	go func() {
		if err := <-done; err == nil && undo != nil {
			undo()
		}
		g.stalled.Add(-1)
	}()
	return errBlobStalled
}

// cleanup runs fn, which releases what a call made (closes a file,
// removes a temporary one), and waits for it for the guard's timeout at
// most. Unlike do it always runs fn, even while calls are refused: a
// descriptor must be closed whatever the folder does. On a folder that
// answers, it has returned when cleanup does, so a failed Put leaves
// nothing behind by the time it returns.
func (g *stallGuard) cleanup(fn func()) {
	done := make(chan struct{})
	go func() {
		fn()
		close(done)
	}()
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// guardedWriter writes to a file of the blob store, each write bounded by
// its guard. It writes from a buffer of its own, so a write left stalled
// never reads a buffer its caller reuses; the buffer is reused from one
// write to the next, and given up to a write left stalled (spare).
type guardedWriter struct {
	f     *os.File
	g     *stallGuard
	spare []byte
}

func (w *guardedWriter) Write(p []byte) (int, error) {
	buf := append(w.spare[:0], p...)
	var n int
	err := w.g.do(func() error {
		var err error
		n, err = w.f.Write(buf)
		return err
	}, nil)
	if errors.Is(err, errBlobStalled) {
		w.spare = nil // the stalled write may still read it
		return 0, err
	}
	w.spare = buf
	return n, err
}

// guardedFile is a blob opened for reading, each call bounded by its
// guard. Reads go through a buffer of its own, copied into the caller's
// only once the read returned in time: net/http hands it pooled buffers,
// which a read left stalled must never write into. The buffer is reused
// from one read to the next, and given up to a read left stalled (spare).
type guardedFile struct {
	f     *os.File
	g     *stallGuard
	spare []byte
}

var _ io.ReadSeekCloser = (*guardedFile)(nil)

func (b *guardedFile) Read(p []byte) (int, error) {
	if cap(b.spare) < len(p) {
		b.spare = make([]byte, len(p))
	}
	buf := b.spare[:len(p)]
	var n int
	err := b.g.do(func() error {
		var err error
		n, err = b.f.Read(buf)
		return err
	}, nil)
	if errors.Is(err, errBlobStalled) {
		b.spare = nil // the stalled read may still write into it
		return 0, blobError("read", err)
	}
	return copy(p, buf[:n]), err
}

func (b *guardedFile) Seek(offset int64, whence int) (int64, error) {
	var pos int64
	err := b.g.do(func() error {
		var err error
		pos, err = b.f.Seek(offset, whence)
		return err
	}, nil)
	if errors.Is(err, errBlobStalled) {
		return 0, blobError("seek", err)
	}
	return pos, err
}

func (b *guardedFile) Close() error {
	b.g.cleanup(func() { b.f.Close() })
	return nil
}
