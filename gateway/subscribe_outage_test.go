package gateway_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// stallingPG is a TCP proxy in front of PostgreSQL that holds back the
// answer to the first statement whose text contains marker, until
// unblock: the statement has run (its snapshot is taken), its result has
// not reached the gateway. Simple protocol only (the text travels with
// the execution).
type stallingPG struct {
	ln       net.Listener
	target   string
	marker   []byte
	mu       sync.Mutex
	armed    bool          // the marker was seen (only the first one counts)
	answered chan struct{} // closed when the held answer's first bytes arrived
	release  chan struct{}
	once     sync.Once
}

func newStallingPG(t *testing.T, marker string) (*stallingPG, string) {
	t.Helper()
	u, err := url.Parse(env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingPG{ln: ln, target: u.Host, marker: []byte(marker), answered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { p.unblock(); ln.Close() })
	go p.serve()
	u.Host = ln.Addr().String()
	return p, u.String()
}

// unblock lets the held answer through (a second call does nothing).
func (p *stallingPG) unblock() { p.once.Do(func() { close(p.release) }) }

func (p *stallingPG) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		var mine atomic.Bool // this connection carries the marked statement
		go func() {          // gateway → PostgreSQL
			defer s.Close()
			pipe(c, s, func(b []byte) {
				p.mu.Lock()
				if !p.armed && bytes.Contains(b, p.marker) {
					p.armed = true
					mine.Store(true)
				}
				p.mu.Unlock()
			})
		}()
		go func() { // PostgreSQL → gateway
			defer c.Close()
			held := false
			pipe(s, c, func([]byte) {
				if mine.Load() && !held {
					held = true
					close(p.answered)
					<-p.release
				}
			})
		}()
	}
}

// pipe copies from → to, calling seen with each chunk before it goes on.
func pipe(from io.Reader, to io.Writer, seen func([]byte)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			seen(buf[:n])
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// The Pub/Sub link drops while a subscribe with sinceSeq reads its
// recovery: what was published meanwhile never reached the instance, and
// the link's resync reached the client before the dialog's subscribed
// frame, so it does not cover the dialog. The dialog gets a resync after
// its subscribed frame, unless the messages came.
func TestLinkDropDuringARecoveryReadIsCovered(t *testing.T) {
	pool := openPool(t)
	proxy, pgURL := newStallingPG(t, "AS fresh")
	ctx := context.Background()
	stalled, err := store.OpenPG(ctx, pgURL, store.PGConfig{MaxConns: 8, ExecMode: pgx.QueryExecModeSimpleProtocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalled.Close)
	in := newInstance(t, stalled, opts{})
	u := in.users(1)[0]
	d := in.dialog(u)
	in.post(u, d, "known")
	c := in.connect(u)

	c.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":1}`)
	select {
	case <-proxy.answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the recovery read did not run")
	}
	// Sent after the read's snapshot; its publish is lost with the link.
	direct := store.New(pool)
	m, _, _, err := direct.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d, SenderID: u, Body: "lost", Event: true})
	if err != nil {
		t.Fatal(err)
	}
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.Do(ctx, "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	if f := c.expect("resync"); f.DialogID != "" {
		t.Fatalf("%s", f.raw)
	}
	proxy.unblock()

	sub := c.expect("subscribed")
	if sub.LastSeq >= m.Seq {
		return // the read saw the message after all: nothing missing
	}
	c.send(`{"type":"ping"}`)
	for {
		f := c.next(10 * time.Second)
		switch {
		case f.Type == "resync" && f.DialogID == "", f.Type == "event" && f.Seq == m.Seq:
			return
		case f.Type == "pong":
			t.Fatalf("subscribed %s after the link's resync, and message %d neither came nor was covered", sub.raw, m.Seq)
		}
	}
}
