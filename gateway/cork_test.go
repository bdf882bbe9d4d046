package gateway

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// deadlineConn records the write deadlines set on it.
type deadlineConn struct {
	net.Conn
	set []time.Time
}

func (d *deadlineConn) SetWriteDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return nil
}

func (d *deadlineConn) Write(p []byte) (int, error) { return len(p), nil }

// Every batch starts with at least the write timeout left on the socket's
// deadline, and a connection writing many batches sets a deadline about
// once per half timeout, not once per batch.
func TestCorkDeadlineCoversEveryBatchAndIsReused(t *testing.T) {
	const timeout = 10 * time.Second
	dc := &deadlineConn{}
	c := &corkConn{Conn: dc}
	start := time.Unix(1_000_000, 0)
	batches := 0
	for now := start; now.Before(start.Add(time.Minute)); now = now.Add(100 * time.Millisecond) {
		if err := c.cork(now, timeout); err != nil {
			t.Fatal(err)
		}
		if _, err := c.writeText([]byte(`{"type":"event"}`)); err != nil {
			t.Fatal(err)
		}
		if err := c.uncork(); err != nil {
			t.Fatal(err)
		}
		batches++
		if len(dc.set) == 0 {
			t.Fatal("no write deadline set for a batch")
		}
		if left := dc.set[len(dc.set)-1].Sub(now); left < timeout || left > timeout+timeout/2 {
			t.Fatalf("batch at +%v starts with %v left on its deadline, want %v..%v", now.Sub(start), left, timeout, timeout+timeout/2)
		}
	}
	// One minute of batches every 100 ms: a deadline every 5 s or so.
	if n := len(dc.set); n > 14 {
		t.Fatalf("%d deadlines set for %d batches in a minute, want about one per half timeout (12)", n, batches)
	}

	// A control frame written outside a batch clears the deadline, and the
	// next batch sets a fresh one.
	if _, err := c.Write([]byte{0x8a, 0}); err != nil { // a pong
		t.Fatal(err)
	}
	if last := dc.set[len(dc.set)-1]; !last.IsZero() {
		t.Fatalf("a write outside a batch left the deadline at %v", last)
	}
	now := start.Add(2 * time.Minute)
	if err := c.cork(now, timeout); err != nil {
		t.Fatal(err)
	}
	c.discard()
	if last := dc.set[len(dc.set)-1]; last.Sub(now) < timeout {
		t.Fatalf("after a cleared deadline the batch got %v", last.Sub(now))
	}
}

// A write that the deadline cut off after part of a frame breaks the
// stream: any byte written after it would be read by the client as the
// rest of that frame. So nothing is written after it — not the close
// frame coder/websocket sends next, nor a ping — and each of those reports
// an error instead.
func TestCorkWritesNothingAfterAFrameCutInTwo(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	defer client.Close()
	c := &corkConn{Conn: server}
	head := make([]byte, 100)
	read := make(chan error, 1)
	go func() { // reads part of the frame, then stops reading
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadFull(client, head)
		read <- err
	}()
	if err := c.cork(time.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.writeText(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	err := c.uncork()
	if !isTimeout(err) {
		t.Fatalf("a batch the client stopped reading: %v, want a timeout", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("the client's read of the frame's first bytes: %v", err)
	}
	if b := writeAfterCut(t, c, client, 500*time.Millisecond); len(b) != 0 {
		t.Fatalf("%d bytes went out after the cut frame: %x", len(b), b)
	}
}

// writeAfterCut has c write a ping and a close frame, as the connection
// does after a failed write, which must each report an error, and returns
// what client reads meanwhile (until wait passes).
func writeAfterCut(t *testing.T, c *corkConn, client net.Conn, wait time.Duration) []byte {
	t.Helper()
	got := make(chan []byte, 1)
	go func() {
		_ = client.SetReadDeadline(time.Now().Add(wait))
		b, _ := io.ReadAll(client)
		got <- b
	}()
	if err := c.writeControl(opPing, nil, time.Now(), time.Second); err == nil {
		t.Error("a ping after a cut frame was written")
	}
	if _, err := c.Write([]byte{0x88, 2, 0x03, 0xe8}); err == nil { // close 1000
		t.Error("a close frame after a cut frame was written")
	}
	return <-got
}

// The same when the frame was cut by an inline write the socket took only
// part of: the rest, collected for the writer, is the frame's continuation,
// and a writer that cannot send it (the client still does not read) drops
// it — so nothing may follow on the wire.
func TestCorkWritesNothingAfterAnInlineWriteCutShort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	raw, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	c := &corkConn{Conn: nc, raw: raw}
	c.rawWriteFn = c.rawWrite
	// Far more than the socket buffers take: the inline write is cut.
	payload := bytes.Repeat([]byte{'a'}, 32<<20)
	sent, rest := c.tryWrite([]outFrame{{b: payload}}, time.Now(), time.Second)
	if !sent || !rest {
		t.Fatalf("inline write of 32 MiB to a client that does not read: sent %v, rest %v; want the rest kept", sent, rest)
	}
	if err := c.cork(time.Now(), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	err = c.flush()
	if !isTimeout(err) {
		t.Fatalf("flushing the rest to a client that does not read: %v, want a timeout", err)
	}
	c.discard()
	// What the client can read now is a prefix of the one frame: its
	// header, then the payload's bytes, nothing else.
	b := writeAfterCut(t, c, client, 2*time.Second)
	if len(b) < 10 || len(b) >= 10+len(payload) {
		t.Fatalf("the client read %d bytes, want part of the one frame", len(b))
	}
	if i := bytes.IndexFunc(b[10:], func(r rune) bool { return r != 'a' }); i >= 0 {
		t.Fatalf("bytes other than the frame's payload at %d after the frame began: %x", 10+i, b[10+i:min(len(b), 10+i+8)])
	}
}
