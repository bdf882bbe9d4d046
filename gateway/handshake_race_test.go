package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/gateway"
)

// A ticket opens one socket, whatever races for it: twelve upgrades with
// the same ticket at once, spread over two instances, give one hello and
// eleven 4001 closes (the redeem is one atomic Redis step).
func TestOneTicketOpensOneSocketAcrossInstances(t *testing.T) {
	pool := openPool(t)
	a := newInstance(t, pool, opts{})
	b := newInstance(t, pool, opts{})
	u := a.users(1)[0]
	for round := range 3 {
		tk, _ := a.ticket(u)
		const n = 12
		var wg sync.WaitGroup
		var mu sync.Mutex
		hellos, unauth := 0, 0
		for i := range n {
			in := a
			if i%2 == 1 {
				in = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := in.connectWith(dialOpts{ticket: tk, origin: testOrigin})
				select {
				case f := <-c.frames:
					if f.Type == "hello" {
						mu.Lock()
						hellos++
						mu.Unlock()
					}
				case <-c.done:
					var ce websocket.CloseError
					if asCloseError(c.err, &ce) && ce.Code == gateway.CloseUnauthorized {
						mu.Lock()
						unauth++
						mu.Unlock()
					}
				case <-time.After(10 * time.Second):
				}
			}()
		}
		wg.Wait()
		if hellos != 1 || unauth != n-1 {
			t.Fatalf("round %d: %d hellos, %d 4001, want 1 and %d", round, hellos, unauth, n-1)
		}
	}
}

// A client that offers han.v1 exactly, after another spelling of it, speaks
// the protocol: the 101 agrees to exactly han.v1 and hello follows. The
// library matches offers without regard to case and used to agree to the
// first spelling, which the exact check then refused with 1008. A client
// that offers only another spelling is refused as before, and the 101
// agrees to nothing.
func TestAnExactSubprotocolOfferIsAgreedWhateverComesBeforeIt(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(1)[0]
	dial := func(offer ...string) (*websocket.Conn, *http.Response) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h := http.Header{}
		h.Set("Authorization", "Bearer "+token(t, u))
		ws, resp, err := websocket.Dial(ctx, in.wsURL(), &websocket.DialOptions{HTTPHeader: h, Subprotocols: offer})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		return ws, resp
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp := dial("HAN.V1", gateway.Subprotocol)
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != gateway.Subprotocol {
		t.Fatalf("offered HAN.V1 then han.v1: the 101 agreed %q", got)
	}
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"hello"`) {
		t.Fatalf("offered HAN.V1 then han.v1: %s %v", b, err)
	}
	ws, resp = dial("HAN.V1")
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != "" {
		t.Fatalf("offered only HAN.V1: the 101 agreed %q", got)
	}
	_, _, err := ws.Read(ctx)
	var ce websocket.CloseError
	if !asCloseError(err, &ce) || ce.Code != gateway.ClosePolicy {
		t.Fatalf("offered only HAN.V1: %v, want 1008", err)
	}
}
