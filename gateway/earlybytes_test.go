package gateway_test

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
)

// upgradeRequest is a hand-written WebSocket upgrade request with a bearer
// token, as a non-browser client sends it.
func upgradeRequest(host, tok string) []byte {
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	return fmt.Appendf(nil, "GET /v1/realtime HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n"+
		"Authorization: Bearer %s\r\n\r\n", host, base64.StdEncoding.EncodeToString(key), gateway.Subprotocol, tok)
}

// maskedText is one client text frame, masked as RFC 6455 requires of
// clients (payload < 126 bytes).
func maskedText(payload string) []byte {
	mask := make([]byte, 4)
	_, _ = rand.Read(mask)
	b := append([]byte{0x81, 0x80 | byte(len(payload))}, mask...)
	for i := range len(payload) {
		b = append(b, payload[i]^mask[i%4])
	}
	return b
}

// readServerFrame reads one unmasked, unfragmented server frame.
func readServerFrame(r io.Reader) (opcode byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	if h[0]&0x70 != 0 || h[1]&0x80 != 0 {
		return 0, nil, fmt.Errorf("unexpected frame header % x", h)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(r, payload)
	return h[0] & 0x0f, payload, err
}

// rawSubscribe opens a raw TCP connection, sends the upgrade request and a
// subscribe frame — in the same write, or in a second write sent before
// the 101 is read — and checks that the 101, hello and subscribed arrive.
func rawSubscribe(addr, host, tok, dialogID string, sameWrite bool) error {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	req := upgradeRequest(host, tok)
	sub := maskedText(`{"type":"subscribe","dialogId":"` + dialogID + `"}`)
	if sameWrite {
		_, err = nc.Write(append(req, sub...))
	} else if _, err = nc.Write(req); err == nil {
		_, err = nc.Write(sub)
	}
	if err != nil {
		return err
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("reading the 101: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return fmt.Errorf("status %d, want 101", resp.StatusCode)
	}
	want := "hello"
	for {
		op, p, err := readServerFrame(br)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", want, err)
		}
		if op == 0x8 {
			code := 0
			if len(p) >= 2 {
				code = int(binary.BigEndian.Uint16(p))
			}
			return fmt.Errorf("waiting for %s: closed with %d %q", want, code, p[min(2, len(p)):])
		}
		var f frame
		if op != 0x1 || json.Unmarshal(p, &f) != nil {
			return fmt.Errorf("waiting for %s: frame opcode %d %q", want, op, p)
		}
		if f.Type == "event" && f.Event == gateway.EventPresenceChanged {
			continue
		}
		if f.Type != want {
			return fmt.Errorf("got %s, want a %s frame", p, want)
		}
		if want == "subscribed" {
			if f.DialogID != dialogID {
				return fmt.Errorf("subscribed to %s, want %s", f.DialogID, dialogID)
			}
			return nil
		}
		want = "subscribed"
	}
}

// A client may send its first frame without waiting for the 101: in the
// same TCP write as the upgrade request, or right after it. Those bytes
// reach the server with the request and must be the first bytes the
// WebSocket reader sees, every time.
func TestFrameSentWithTheUpgradeIsAnswered(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	// Sockets close while the next ones open: spread them over enough users
	// that no user ever comes near the per-user connection cap.
	users := in.users(32)
	d := in.dialog(users...)
	toks := make([]string, len(users))
	for i, u := range users {
		toks[i] = token(t, u)
	}
	addr := in.srv.Listener.Addr().String()
	const n = 500
	for _, tc := range []struct {
		name      string
		sameWrite bool
	}{{"one write", true}, {"second write before the 101", false}} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range n {
				if err := rawSubscribe(addr, addr, toks[i%len(toks)], d, tc.sameWrite); err != nil {
					t.Fatalf("attempt %d of %d: %v", i+1, n, err)
				}
			}
		})
	}
}
