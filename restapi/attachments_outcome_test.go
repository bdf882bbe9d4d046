package restapi_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
)

// replyDropper is a TCP proxy in front of PostgreSQL. Once armed with a
// statement's text, it forwards that statement and what follows on its
// connection until PostgreSQL answers that the statement's transaction
// ended (ReadyForQuery, idle): the statement's own answer when it ran
// alone, its COMMIT's when it ran in a transaction. That answer it does
// not forward: it cuts the client's connection instead. The write
// committed, and the client only sees its connection drop.
type replyDropper struct {
	ln     net.Listener
	target string
	fired  chan struct{} // closed once an armed statement's answer was dropped

	mu     sync.Mutex
	marker []byte // guarded by mu; nil: disarmed
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: target, fired: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// arm makes the transaction of the next statement whose text contains
// marker lose the answer that ends it.
func (p *replyDropper) arm(marker string) {
	p.mu.Lock()
	p.marker = []byte(marker)
	p.mu.Unlock()
}

func (p *replyDropper) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		l := &droppedLink{client: c, server: up}
		p.wg.Add(2)
		go p.toServer(l)
		go p.toClient(l)
	}
}

// droppedLink is one proxied connection; toServer sets dropping before it
// forwards the armed statement, and toClient reads it.
type droppedLink struct {
	client, server net.Conn
	mu             sync.Mutex
	dropping       bool
}

func (l *droppedLink) isDropping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropping
}

func (p *replyDropper) toServer(l *droppedLink) {
	defer p.wg.Done()
	defer l.server.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.marker != nil && bytes.Contains(buf[:n], p.marker) {
				p.marker = nil
				l.mu.Lock()
				l.dropping = true
				l.mu.Unlock()
			}
			p.mu.Unlock()
			if _, werr := l.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *replyDropper) toClient(l *droppedLink) {
	defer p.wg.Done()
	defer l.client.Close()
	readyForQuery := []byte{'Z', 0, 0, 0, 5}
	var held []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := l.server.Read(buf)
		out := buf[:n]
		if n > 0 && l.isDropping() {
			// An answer is complete at its ReadyForQuery, whose last byte
			// is the transaction status: 'I' idle (it ended, committed
			// here), 'T' still in the transaction (passed on).
			held = append(held, out...)
			i := bytes.Index(held, readyForQuery)
			if i < 0 || i+5 >= len(held) {
				out = nil
			} else if held[i+5] == 'I' {
				close(p.fired)
				l.client.Close()
				l.server.Close()
				return
			} else {
				out, held = held, nil
			}
		}
		if len(out) > 0 {
			if _, werr := l.client.Write(out); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// An upload whose final write PostgreSQL committed but whose answer was
// lost (the connection dropped after the COMMIT was sent, and the server
// committed) fails with an error, and keeps its blob: the row now says uploaded and names it, so
// deleting it would make every download fail for good. A retry of the
// same bytes then succeeds, and the download serves them.
func TestUploadKeepsItsBlobWhenTheCommitsAnswerIsLost(t *testing.T) {
	base := newHarness(t) // migrations; its pool goes straight to PostgreSQL
	u, err := url.Parse(env.DirectURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startReplyDropper(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	// The simple protocol sends each statement as one message holding its
	// text, so the proxy knows which answer to drop.
	pool, err := store.OpenPG(context.Background(), u.String(),
		store.PGConfig{MaxConns: 8, ExecMode: mustExecMode(t, "simple_protocol")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	dir := t.TempDir()
	h := base.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime, d.Store = base.rdb, base.rt, store.New(pool)
		d.Config.Attachments = restapi.AttachmentConfig{BlobDir: dir}
	})
	_, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)
	code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "a.txt", "text/plain", 3), idemKey())
	if code != 201 {
		t.Fatalf("init: %d %s", code, b)
	}
	up := decode[uploadResp](t, b)

	proxy.arm("UPDATE attachments SET status='uploaded'")
	code, b = h.put(up.UploadURL, "text/plain", "abc")
	select {
	case <-proxy.fired:
	default:
		t.Fatalf("the upload's write never committed through the proxy: %d %s", code, b)
	}
	// The connection closed under the COMMIT: PostgreSQL unavailable, as
	// far as this request can tell.
	wantError(t, code, b, 503, "database_unavailable")
	var key string
	if err := base.pool.QueryRow(context.Background(), "SELECT COALESCE(blob_key, '') FROM attachments WHERE id=$1 AND status='uploaded'",
		up.ID).Scan(&key); err != nil {
		t.Fatalf("the write did not commit (the test needs it to): %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(key)))
	if err != nil || string(got) != "abc" {
		t.Fatalf("the blob the committed row names is gone (%v): downloads would fail forever", err)
	}

	if code, b := h.put(up.UploadURL, "text/plain", "abc"); code != 200 {
		t.Fatalf("a retry of the same bytes: %d %s", code, b)
	}
	code, b = h.do(bTok, "GET", "/v1/attachments/"+up.ID+"/download-url", "")
	if code != 200 {
		t.Fatalf("download url: %d %s", code, b)
	}
	if resp, got := h.get(decode[downloadResp](t, b).URL); resp.StatusCode != 200 || string(got) != "abc" {
		t.Fatalf("download: %d %q", resp.StatusCode, got)
	}
	var files []string
	_ = filepathWalk(dir, &files)
	if len(files) != 1 || !strings.HasSuffix(filepath.ToSlash(files[0]), key) {
		t.Fatalf("blob files %v, want only the one the row names (%s): the retry's own is deleted", files, key)
	}
}

func mustExecMode(t *testing.T, name string) pgx.QueryExecMode {
	t.Helper()
	m, err := store.ParseExecMode(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
