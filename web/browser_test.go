package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	browsertest "github.com/han-app/gateway/internal/testenv/browser"
	"github.com/han-app/gateway/web"
)

// The client in headless Chromium (Debian's chromium package, never a
// downloaded browser) against a server that answers what the real one
// never would: download URLs elsewhere, markup in every text field, a
// dialog that keeps growing. What the real server sends is covered by the
// browser tests of cmd/han-gateway.

// startChromium starts one headless Chromium for the test; without one in
// PATH the test is skipped, or fails when CI=true. An uncaught exception
// in the page fails the test.
func startChromium(t *testing.T) context.Context {
	t.Helper()
	ctx := browsertest.Start(t)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 860)); err != nil {
		t.Fatalf("viewport: %v", err)
	}
	var mu sync.Mutex
	var thrown []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if ev, ok := ev.(*runtime.EventExceptionThrown); ok {
			line := ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				line += " " + ev.ExceptionDetails.Exception.Description
			}
			mu.Lock()
			thrown = append(thrown, line)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() {
		mu.Lock()
		if len(thrown) > 0 {
			t.Errorf("uncaught exceptions in the page:\n  %s", strings.Join(thrown, "\n  "))
		}
		mu.Unlock()
	})
	return ctx
}

// evalJS evaluates a JavaScript expression (promises awaited).
func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	return v
}

// waitJS polls a boolean JavaScript expression until it holds.
func waitJS(t *testing.T, ctx context.Context, timeout time.Duration, what, expr string) {
	t.Helper()
	end := time.Now().Add(timeout)
	var last error
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := chromedp.Run(c, chromedp.Evaluate[bool]("Boolean("+expr+")"))
		cancel()
		if err == nil && ok {
			return
		}
		last = err
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible)); err != nil {
		t.Fatalf("click %s: %v", sel, err)
	}
}

// Text a member controls, as another member's client receives it.
const (
	hostileBody     = "<img src=x onerror=\"document.title='pwned'\"> \"' & \u202egnp.exe\x00 <script>document.title='pwned'</script>"
	hostileTitle    = "<b>bold</b>\"><img src=x onerror=\"document.title='pwned'\">\u202e"
	hostileFilename = "\"><img src=x onerror=\"document.title='pwned'\">.pdf"
	hostileType     = "application/pdf\"><svg onload=\"document.title='pwned'\">"
)

// hostileAPI serves the client (web.Handler) and, under /v1/, a user's
// view of one dialog with another user. Realtime tickets are refused, so
// the client reads the open dialog by polling REST.
type hostileAPI struct {
	me, other, dialog, attachment string
	messages                      atomic.Int64 // the dialog holds seq 1..messages
	mu                            sync.Mutex   // guards downloadURL
	downloadURL                   string       // what download-url answers
	blobReads                     atomic.Int64 // requests for the attachment's bytes
}

func (a *hostileAPI) setDownloadURL(u string) {
	a.mu.Lock()
	a.downloadURL = u
	a.mu.Unlock()
}

func (a *hostileAPI) message(seq int64) map[string]any {
	m := map[string]any{"id": fmt.Sprintf("00000000-0000-4000-8000-%012d", seq), "dialogId": a.dialog, "seq": seq,
		"senderId": a.other, "body": fmt.Sprintf("message %d", seq), "createdAt": time.Now().UnixMilli() - 1000, "attachments": []any{}}
	switch seq {
	case 1:
		m["body"] = hostileBody
		m["attachments"] = []any{map[string]any{"id": a.attachment, "filename": hostileFilename, "contentType": hostileType, "sizeBytes": 1234}}
	case 2: // what a broken server or proxy might pass on
		m["createdAt"] = "soon"
		m["attachments"] = []any{map[string]any{"id": "x", "filename": nil, "contentType": 5, "sizeBytes": "big"}, "junk", nil}
	case 3:
		m["createdAt"] = 1e300
		m["attachments"] = "junk"
	}
	return m
}

func (a *hostileAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		web.Handler("").ServeHTTP(w, r)
		return
	}
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	p := r.URL.Path
	switch {
	case p == "/v1/me":
		reply(200, map[string]any{"id": a.me})
	case p == "/v1/public/config":
		reply(200, map[string]any{"realtimeUrl": nil})
	case p == "/v1/realtime/tickets":
		reply(503, map[string]any{"error": "redis_unavailable"})
	case p == "/v1/dialogs":
		reply(200, map[string]any{"nextCursor": nil, "items": []any{map[string]any{
			"id": a.dialog, "title": hostileTitle, "memberIds": []string{a.me, a.other},
			"lastSeq": a.messages.Load(), "createdAt": time.Now().UnixMilli() - 5000, "lastMessage": a.message(a.messages.Load())}}})
	case p == "/v1/dialogs/"+a.dialog+"/messages":
		after, _ := strconv.ParseInt(r.URL.Query().Get("afterSeq"), 10, 64)
		limit, _ := strconv.ParseInt(r.URL.Query().Get("limit"), 10, 64)
		if limit <= 0 || limit > 100 {
			limit = 100
		}
		n := a.messages.Load()
		items := []any{}
		for s := after + 1; s <= n && s <= after+limit; s++ {
			items = append(items, a.message(s))
		}
		var next any
		if last := after + int64(len(items)); last < n {
			next = strconv.FormatInt(last, 10)
		}
		reply(200, map[string]any{"items": items, "nextCursor": next})
	case strings.HasPrefix(p, "/v1/users/"):
		reply(200, map[string]any{"online": false, "connections": 0, "lastSeenAt": nil})
	case p == "/v1/attachments/"+a.attachment+"/download-url":
		a.mu.Lock()
		u := a.downloadURL
		a.mu.Unlock()
		reply(200, map[string]any{"url": u, "expiresAt": time.Now().Add(time.Minute).UnixMilli()})
	case p == "/v1/attachments/"+a.attachment+"/blob":
		a.blobReads.Add(1)
		w.Header().Set("Content-Disposition", "attachment")
		reply(200, map[string]any{})
	default:
		reply(404, map[string]any{"error": "not_found"})
	}
}

// openDialog signs in with a sign-in link and opens the dialog.
func openDialog(t *testing.T, ctx context.Context, base string, a *hostileAPI) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(base+"/#token=anything")); err != nil {
		t.Fatalf("open: %v", err)
	}
	confirmLinkSignIn(t, ctx)
	waitJS(t, ctx, 10*time.Second, "the dialog list", fmt.Sprintf("document.querySelector('[data-dialog=%q]')", a.dialog))
	evalJS[bool](t, ctx, fmt.Sprintf("(location.hash = %q, true)", "#/chat/"+a.dialog))
	waitJS(t, ctx, 10*time.Second, "the messages", "document.querySelector('#messages li.msg')")
}

func newHostileAPI(messages int64) (*hostileAPI, *httptest.Server) {
	a := &hostileAPI{me: "00000000-0000-4000-8000-00000000a11c", other: "00000000-0000-4000-8000-000000000bad",
		dialog: "00000000-0000-4000-8000-0000000d1a10", attachment: "00000000-0000-4000-8000-0000000a77ac"}
	a.messages.Store(messages)
	return a, httptest.NewServer(a)
}

// Another member's markup in a message body, a dialog title, an attachment
// name and content type shows as text: no element is made from it and no
// script of it runs. Messages a broken server mangled (a time that is not
// a number or out of range, attachments that are not objects or lack
// their fields) are shown with what they have, and the others with them. A download link is followed only when it is this
// origin's /v1/attachments/<id>/blob: an answer naming another origin (or
// a path that a browser reads as one) leaves the page where it is and says
// invalid_response.
func TestHostileTextAndDownloadLinksStayInert(t *testing.T) {
	ctx := startChromium(t)
	a, srv := newHostileAPI(3)
	defer srv.Close()
	openDialog(t, ctx, srv.URL, a)
	waitJS(t, ctx, 5*time.Second, "messages 1-3 and the dialog list", `[...document.querySelectorAll('#messages li.msg')].map((e) => e.dataset.seq).join() === "1,2,3" &&
		document.querySelector('#messages li.msg[data-seq="3"] .body').textContent === "message 3" &&
		document.querySelector('.dialog-sub').textContent.endsWith("message 3")`)

	got := evalJS[string](t, ctx, `JSON.stringify({
		body: document.querySelector('#messages li.msg[data-seq="1"] .body').textContent,
		title: document.querySelector('#dialog-title').textContent,
		listed: document.querySelector('.dialog-name').textContent,
		file: document.querySelector('.att-name').textContent,
		type: document.querySelector('.att-size').textContent,
		label: document.querySelector('.att-dl').getAttribute('aria-label'),
		injected: document.querySelectorAll('#main img, #main svg:not(.icon), #main script, #main b').length,
		docTitle: document.title,
	})`)
	var res struct {
		Body, Title, Listed, File, Type, Label, DocTitle string
		Injected                                         int
	}
	if err := json.Unmarshal([]byte(got), &res); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	for what, c := range map[string][2]string{
		"message body": {res.Body, hostileBody}, "dialog title": {res.Title, hostileTitle},
		"listed title": {res.Listed, hostileTitle}, "file name": {res.File, hostileFilename},
		"download label": {res.Label, "Download " + hostileFilename},
	} {
		if c[0] != c[1] {
			t.Errorf("%s shows %q, want the text %q", what, c[0], c[1])
		}
	}
	if !strings.HasSuffix(res.Type, hostileType) {
		t.Errorf("content type shows %q, want the text %q", res.Type, hostileType)
	}
	if res.Injected != 0 || res.DocTitle == "pwned" {
		t.Errorf("markup from the server became elements (%d) or ran (title %q)", res.Injected, res.DocTitle)
	}

	for _, u := range []string{"http://evil.invalid/steal", "//evil.invalid/steal", `/\evil.invalid/steal`,
		"javascript:document.title='pwned'", "/v1/me", "/v1/attachments/00000000-0000-4000-8000-000000000000/blob"} {
		a.setDownloadURL(u)
		evalJS[bool](t, ctx, `(document.querySelectorAll('.toast').forEach((e) => e.remove()), true)`)
		click(t, ctx, ".att-dl")
		waitJS(t, ctx, 5*time.Second, "the refusal of "+u, `document.querySelector('.toast-error')`)
		time.Sleep(300 * time.Millisecond) // a navigation, had one started, would have left the page
		state := evalJS[string](t, ctx, `location.origin + " " + !!document.querySelector('#messages li.msg') + " " + document.title + " " +
			(document.querySelector('.toast-error') || {}).textContent`)
		if want := srv.URL + " true"; !strings.HasPrefix(state, want) || strings.Contains(state, "pwned") || !strings.Contains(state, "invalid_response") {
			t.Errorf("download URL %q: page is %q, want it to stay at %s and say invalid_response", u, state, srv.URL)
		}
	}
	a.setDownloadURL("/v1/attachments/" + a.attachment + "/blob?expires=1&sig=x")
	click(t, ctx, ".att-dl")
	deadline := time.Now().Add(5 * time.Second)
	for a.blobReads.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if a.blobReads.Load() == 0 {
		t.Error("the API's own blob URL was not followed")
	}
}

// A dialog that keeps receiving while it is read at its end shows the
// latest 1000 messages, not every one since it was opened (each arrival
// renders the list again); "Load earlier messages" brings back older ones.
func TestAGrowingDialogShowsABoundedWindow(t *testing.T) {
	ctx := startChromium(t)
	a, srv := newHostileAPI(50)
	defer srv.Close()
	openDialog(t, ctx, srv.URL, a)
	waitJS(t, ctx, 10*time.Second, "the first window", `document.querySelectorAll('#messages li.msg').length === 50`)
	a.messages.Store(1550) // the offline poll (every 5 s) reads them
	waitJS(t, ctx, 30*time.Second, "message 1550", `document.querySelector('#messages li.msg[data-seq="1550"]')`)
	shown := evalJS[string](t, ctx, `(() => { const l = document.querySelectorAll('#messages li.msg');
		return l.length + " " + l[0].dataset.seq + " " + !document.querySelector('#load-older').hidden; })()`)
	if shown != "1000 551 true" {
		t.Fatalf("shown (count, first seq, load earlier offered): %q, want \"1000 551 true\"", shown)
	}
	click(t, ctx, "#load-older")
	waitJS(t, ctx, 10*time.Second, "the earlier page", `document.querySelector('#messages li.msg[data-seq="501"]')`)
	shown = evalJS[string](t, ctx, `(() => { const l = document.querySelectorAll('#messages li.msg');
		return l.length + " " + l[0].dataset.seq + " " + l[l.length - 1].dataset.seq; })()`)
	if shown != "1050 501 1550" {
		t.Errorf("after Load earlier messages: %q, want \"1050 501 1550\"", shown)
	}
}
