package gateway_test

import (
	"bufio"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// An idle connection's reader waits for the next frame on the smallest
// stack a goroutine blocked in a socket read can have (2 KiB; more in a
// race-detector build), whatever the connection did before: its
// subscribe, its ping frame and its WebSocket ping were read and answered
// on frame workers, which go away once idle. A goroutine's stack never
// shrinks while it is blocked in a read, so a reader that read its frames
// itself would hold twice that or more for the connection's life: at
// 19,000 idle connections, 38 MB more.
func TestIdleReaderKeepsTheSmallestStack(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	const n, members = 200, 10
	// Goroutines that ended leave their stacks for new ones to reuse,
	// which would hide stacks from the measurements below: parked ones
	// take them all first.
	defer parkGoroutines(20000)()
	floor := blockedReadStack(t, n) // held until the test ends: no stack of theirs is reused below
	users := in.users(n)
	dialogs := make([]string, n/members)
	for i := range dialogs {
		dialogs[i] = in.dialog(users[i*members : (i+1)*members]...)
	}
	before := stackInuse()
	for i, u := range users {
		rc := in.rawConnect(u)
		rc.write(`{"type":"subscribe","dialogId":"` + dialogs[i/members] + `"}`)
		if f := rc.readSkipPresence(); f.Type != "subscribed" {
			t.Fatalf("client %d: want subscribed, got %s", i, f.raw)
		}
		rc.write(`{"type":"ping"}`)
		if f := rc.readSkipPresence(); f.Type != "pong" {
			t.Fatalf("client %d: want pong, got %s", i, f.raw)
		}
		flood(rc, clientFrame(opPing, []byte("are you there")))
	}
	// The frame workers and writers are gone within a few seconds.
	var per float64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		per = float64(stackInuse()-before) / n
		if per <= 1.5*floor {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%.0f B of goroutine stack per idle connection, want the %.0f B of a goroutine blocked in a socket read", per, floor)
		}
	}
	t.Logf("%d idle connections: %.0f B of goroutine stack each (a bare blocked read: %.0f B)", n, per, floor)
	if got := in.svc.Stats().Connections; got != n {
		t.Fatalf("%d connections open, want %d", got, n)
	}
}

// blockedReadStack is the goroutine stack per goroutine of n goroutines
// blocked in a buffered read of a loopback TCP connection: the least a
// connection's reader can hold in this build. They stay blocked until the
// test ends.
func blockedReadStack(t *testing.T, n int) float64 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	done := make(chan struct{}, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
		for range n {
			<-done
		}
	})
	before := stackInuse()
	for range n {
		cc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		sc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, cc, sc)
		go func() {
			_, _ = bufio.NewReaderSize(sc, 16).Peek(1)
			done <- struct{}{}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	return float64(stackInuse()-before) / float64(n)
}

// parkGoroutines starts n goroutines that wait until the returned func is
// called.
func parkGoroutines(n int) (release func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		go func() {
			defer wg.Done()
			<-stop
		}()
	}
	return func() {
		close(stop)
		wg.Wait()
	}
}

func stackInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.StackInuse
}
