package gateway_test

import (
	"bufio"
	"crypto/rand"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
)

// maskedPong is a client pong frame echoing payload (< 126 bytes).
func maskedPong(payload []byte) []byte {
	mask := make([]byte, 4)
	_, _ = rand.Read(mask)
	b := append([]byte{0x8A, 0x80 | byte(len(payload))}, mask...)
	for i, c := range payload {
		b = append(b, c^mask[i%4])
	}
	return b
}

// firstPing opens a raw WebSocket connection and returns when its hello
// frame and the server's first ping arrived (answering the ping with a
// pong).
func firstPing(addr, tok string) (hello, ping time.Time, err error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return hello, ping, err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Write(upgradeRequest(addr, tok)); err != nil {
		return hello, ping, err
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return hello, ping, err
	}
	resp.Body.Close()
	for {
		op, p, err := readServerFrame(br)
		if err != nil {
			return hello, ping, err
		}
		switch {
		case op == 0x1 && hello.IsZero():
			hello = time.Now()
		case op == 0x9:
			if hello.IsZero() {
				return hello, ping, errors.New("a ping before the hello frame")
			}
			ping = time.Now()
			_, err := nc.Write(maskedPong(p))
			return hello, ping, err
		}
	}
}

// Connections opened together get their first ping spread over half the
// ping interval, so they do not ping (and pong) in one burst every
// interval.
func TestFirstPingsOfAStormAreSpread(t *testing.T) {
	const interval = 2 * time.Second
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.PingInterval = interval }})
	addr := strings.TrimPrefix(in.srv.URL, "http://")
	const n = 24
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = token(t, ids.New())
	}
	start := time.Now()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		at    []time.Duration // first pings, from the start of the storm
		after []time.Duration // first pings, from each connection's hello
		errs  []error
	)
	for _, tok := range tokens {
		wg.Go(func() {
			hello, ping, err := firstPing(addr, tok)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			at = append(at, ping.Sub(start))
			after = append(after, ping.Sub(hello))
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d connections failed: %v", len(errs), errs[0])
	}
	slices.Sort(at)
	// Every first ping within the interval (plus the hub's scan) of its
	// own connect: the handshakes of the storm themselves may take a
	// while on a busy machine, and that is not what is measured here.
	if late := slices.Max(after); late > interval+interval/4+time.Second {
		t.Fatalf("a first ping came %v after its connection's hello, interval %v", late, interval)
	}
	// Not all in one scan: without the spread they land in one scan of a
	// quarter second, or two adjacent ones (at most ≈ 250 ms apart); with
	// it they fall over four scans, and all of them in two adjacent ones
	// happens about three times in 2^n runs (with twelve connections,
	// once in 1,400 runs: a test that failed that often on its own).
	if spread := at[n-1] - at[0]; spread < interval/5 {
		t.Fatalf("first pings within %v of each other (%v): not spread over the interval", spread, at)
	}
}
