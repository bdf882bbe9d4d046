package main

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
)

// Through the whole instance (connection caps, middleware, hijack): a
// client that sends its first frame in the same write as the upgrade
// request, with a small header and with a 6 KiB cookie as a browser may
// send, gets the 101, the hello, and that early subscribe answered.
func TestEarlySubscribeWithSmallAndLargeHandshakeHeaders(t *testing.T) {
	m := start(t, baseEnv())
	alice, bob := ids.New(), ids.New()
	aTok, bTok := userToken(t, alice), userToken(t, bob)
	dialog := dialogOf(t, clientFrom("127.0.0.2"), m.URL(), aTok, bTok, bob)
	for _, extra := range []string{"", "Cookie: s=" + strings.Repeat("c", 6000) + "\r\n"} {
		c := rawDial(t, "127.0.0.3", m.Addr(), nil)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		req := "GET /v1/realtime HTTP/1.1\r\nHost: " + m.Addr() + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: han.v1\r\n" +
			"Authorization: Bearer " + aTok + "\r\n" + extra + "\r\n"
		sub := `{"type":"subscribe","dialogId":"` + dialog + `"}`
		if _, err := c.Write(append([]byte(req), clientText(sub)...)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("header of %d bytes: %v %v", len(req), resp, err)
		}
		var got []string
		for len(got) < 2 {
			p, err := serverText(br)
			if err != nil {
				t.Fatalf("header of %d bytes: after %q: %v", len(req), got, err)
			}
			got = append(got, p)
		}
		if !strings.Contains(got[0], `"type":"hello"`) || !strings.Contains(got[1], `"type":"subscribed"`) {
			t.Fatalf("header of %d bytes: frames %q, want hello then subscribed", len(req), got)
		}
	}
}

// clientText is one masked client text frame (payload < 126 bytes).
func clientText(payload string) []byte {
	mask := [4]byte{0x12, 0x34, 0x56, 0x78}
	b := append([]byte{0x81, 0x80 | byte(len(payload))}, mask[:]...)
	for i := range len(payload) {
		b = append(b, payload[i]^mask[i%4])
	}
	return b
}

// serverText reads one unfragmented server text frame (payload < 64 KiB).
func serverText(r io.Reader) (string, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", err
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return "", err
		}
		n = int(ext[0])<<8 | int(ext[1])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return "", err
	}
	if h[0] != 0x81 {
		return "", io.ErrUnexpectedEOF
	}
	return string(p), nil
}
