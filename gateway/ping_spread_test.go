package gateway_test

import (
	"bufio"
	"crypto/rand"
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

// firstPing opens a raw WebSocket connection and returns when the server's
// first ping arrived (answering it with a pong).
func firstPing(addr, tok string) (time.Time, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return time.Time{}, err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Write(upgradeRequest(addr, tok)); err != nil {
		return time.Time{}, err
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return time.Time{}, err
	}
	resp.Body.Close()
	for {
		op, p, err := readServerFrame(br)
		if err != nil {
			return time.Time{}, err
		}
		if op == 0x9 {
			at := time.Now()
			_, err := nc.Write(maskedPong(p))
			return at, err
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
	const n = 12
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = token(t, ids.New())
	}
	start := time.Now()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		at   []time.Duration
		errs []error
	)
	for _, tok := range tokens {
		wg.Go(func() {
			ping, err := firstPing(addr, tok)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			at = append(at, ping.Sub(start))
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d connections failed: %v", len(errs), errs[0])
	}
	slices.Sort(at)
	// Every first ping within the interval (plus the hub's scan), and
	// not all in one scan: without the spread they land in one scan of a
	// quarter second, or two adjacent ones (at most ≈ 250 ms apart); with
	// it they fall over four scans, and all twelve in two adjacent ones
	// happens about once in 1,000 runs.
	if at[n-1] > interval+interval/4+time.Second {
		t.Fatalf("a first ping came %v after the connect, interval %v", at[n-1], interval)
	}
	if spread := at[n-1] - at[0]; spread < interval/5 {
		t.Fatalf("first pings within %v of each other (%v): not spread over the interval", spread, at)
	}
}
