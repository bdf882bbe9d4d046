package wsedge

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// BenchmarkHandshake: one upgrade request per connection on loopback,
// hijacked by the handler, which writes one byte and closes; the client
// reads to EOF. "net-http" is an http.Server on the listener alone,
// "wsedge" the same server behind a Listener. Both ends run in this
// process, so B/op and allocs/op are the server's plus the same client
// work in both.
func BenchmarkHandshake(b *testing.B) {
	hijack := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			b.Error(err)
			return
		}
		_, _ = c.Write([]byte{'k'})
		_ = c.Close()
	})
	for _, arm := range []string{"net-http", "wsedge"} {
		b.Run(arm, func(b *testing.B) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var ln net.Listener = inner
			if arm == "wsedge" {
				ln = New(inner, Config{Path: "/v1/realtime", Handler: hijack, HeaderTimeout: 10 * time.Second})
			}
			srv := &http.Server{Handler: hijack, ReadHeaderTimeout: 10 * time.Second}
			done := make(chan struct{})
			go func() { _ = srv.Serve(ln); close(done) }()
			defer func() { _ = srv.Close(); <-done }()
			req := []byte(upgradeHead)
			buf := make([]byte, 16)
			b.ReportAllocs()
			for b.Loop() {
				c, err := net.Dial("tcp", inner.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				if n, _ := io.ReadFull(c, buf[:1]); n != 1 {
					b.Fatal("no answer")
				}
				_ = c.Close()
			}
		})
	}
}
