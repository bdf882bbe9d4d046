package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/testenv"
	browsertest "github.com/han-app/gateway/internal/testenv/browser"
)

// Browser tests: the real web client (web/static) in headless Chromium from
// the Debian package, driven over the DevTools protocol by chromedp, against
// the real service (Main) on real Redis and PostgreSQL. One browser per run;
// each user gets a browser context of their own (separate storage).
//
// Screenshots of every step go to $HAN_SCREENSHOT_DIR, or else to a folder
// in the test's temporary directory; the folder is logged.

// browser is one Chromium process for a test.
type browser struct {
	t     *testing.T
	ctx   context.Context // the browser's root chromedp context
	shots string          // screenshot folder
	mu    sync.Mutex      // guards seq
	seq   int
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	return &browser{t: t, ctx: browsertest.Start(t), shots: screenshotDir(t)}
}

func screenshotDir(t *testing.T) string {
	dir := os.Getenv("HAN_SCREENSHOT_DIR")
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("screenshot folder: %v", err)
	}
	// Only this test's own earlier screenshots (NN-<page>-<step>.png) go.
	old, _ := filepath.Glob(filepath.Join(dir, "[0-9][0-9]-*.png"))
	for _, f := range old {
		_ = os.Remove(f)
	}
	t.Logf("screenshots: %s", dir)
	t.Cleanup(func() {
		if os.Getenv("HAN_SCREENSHOT_DIR") == "" {
			t.Logf("screenshots were in %s (removed with the test's temporary folder; set HAN_SCREENSHOT_DIR to keep them)", dir)
		} else {
			t.Logf("screenshots: %s", dir)
		}
	})
	return dir
}

// page is one tab in a browser context of its own (one user).
type page struct {
	b    *browser
	t    *testing.T
	name string
	ctx  context.Context

	mu     sync.Mutex // guards errors
	errors []string   // uncaught exceptions and console.error lines
}

func (b *browser) newPage(t *testing.T, name string) *page {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	p := &page{b: b, t: t, name: name, ctx: ctx}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 860)); err != nil {
		t.Fatalf("%s: open tab: %v", name, err)
	}
	err := chromedp.Listen(ctx, func(ev any) {
		var line string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			line = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				line += " " + ev.ExceptionDetails.Exception.Description
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type != runtime.ConsoleAPICalledTypeError {
				return
			}
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			line = "console.error: " + strings.Join(parts, " ")
		default:
			return
		}
		p.mu.Lock()
		p.errors = append(p.errors, line)
		p.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("%s: listen: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			p.shot("FAILED")
			if errs := p.jsErrors(); len(errs) > 0 {
				t.Logf("%s: JavaScript errors:\n  %s", name, strings.Join(errs, "\n  "))
			}
		}
		cancel()
	})
	return p
}

// jsErrors are the page's uncaught exceptions and console errors so far.
func (p *page) jsErrors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errors...)
}

// do runs actions with a bound, failing the test on error.
func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %s: %v", p.name, what, err)
	}
}

// eval evaluates a JavaScript expression (promises awaited).
func eval[T any](p *page, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

func mustEval[T any](p *page, expr string) T {
	p.t.Helper()
	v, err := eval[T](p, expr)
	if err != nil {
		p.t.Fatalf("%s: eval %s: %v", p.name, expr, err)
	}
	return v
}

// waitJS polls a boolean JavaScript expression until it holds.
func (p *page) waitJS(timeout time.Duration, what, expr string) {
	p.t.Helper()
	var last error
	testenv.Eventually(p.t, timeout, func() bool {
		ok, err := eval[bool](p, "Boolean("+expr+")")
		last = err
		return err == nil && ok
	}, "%s: %s (last error: %v)", p.name, what, errorsOrNil(last))
}

func errorsOrNil(err error) any {
	if err == nil {
		return "none"
	}
	return err
}

// waitSel waits until a CSS selector matches an element.
func (p *page) waitSel(timeout time.Duration, what, sel string) {
	p.t.Helper()
	p.waitJS(timeout, what, fmt.Sprintf("document.querySelector(%q)", sel))
}

// text is the trimmed textContent of the first match ("" if none).
func (p *page) text(sel string) string {
	p.t.Helper()
	return mustEval[string](p, fmt.Sprintf("(document.querySelector(%q)?.textContent ?? '').trim()", sel))
}

// shot saves a screenshot of the viewport as NN-<name>-<step>.png.
func (p *page) shot(step string) {
	b := p.b
	b.mu.Lock()
	b.seq++
	n := b.seq
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Logf("%s: screenshot %s: %v", p.name, step, err)
		return
	}
	name := fmt.Sprintf("%02d-%s-%s.png", n, p.name, step)
	if err := os.WriteFile(filepath.Join(b.shots, name), png, 0o644); err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
	}
}

// setValue replaces an input's value and fires input/change like typing.
func (p *page) setValue(sel, value string) {
	p.t.Helper()
	_ = mustEval[bool](p, fmt.Sprintf(`(() => { const el = document.querySelector(%q); el.value = %q;
		el.dispatchEvent(new Event("input", {bubbles: true})); el.dispatchEvent(new Event("change", {bubbles: true})); return true; })()`, sel, value))
}

// click clicks the element sel matches. The client re-renders lists when
// live events arrive, so the node found may be replaced before the click
// lands ("Could not find node with given id"); a person would click the new
// one, so the click is retried on a fresh lookup a few times.
func (p *page) click(sel string) {
	p.t.Helper()
	var err error
	for range 5 {
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		err = chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
		cancel()
		if err == nil || !strings.Contains(err.Error(), "Could not find node") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("%s: click %s: %v", p.name, sel, err)
	}
}

// confirmLinkSignIn answers Sign in to the question a sign-in link opened
// in a signed-out tab asks.
func (p *page) confirmLinkSignIn() {
	p.t.Helper()
	p.waitSel(deliveryBound, "the sign-in question", "#link-signin-go")
	p.click("#link-signin-go")
}

func (p *page) typeInto(sel, keys string) {
	p.t.Helper()
	p.do("type into "+sel, chromedp.SendKeys(chromedp.CSS(sel), keys, chromedp.NodeVisible))
}

// pressEnter presses Enter in an element. A real browser types no newline
// when the page prevents the keydown's default; the protocol's separate
// char event would, so it is not sent.
func (p *page) pressEnter(sel string) {
	p.t.Helper()
	p.do("press Enter in "+sel, chromedp.Focus(chromedp.CSS(sel), chromedp.NodeVisible),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			for _, k := range kb.Encode('\r') {
				if k.Type == kb.KeyChar {
					continue
				}
				if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, *k); err != nil {
					return err
				}
			}
			return nil
		}))
}

// netLog records the requests a page made through an interception.
type netLog struct {
	mu       sync.Mutex // guards keys, replayed
	keys     []string   // Idempotency-Key of each matching request
	replayed []string   // Idempotent-Replayed of each answer (the first was lost)
}

func (l *netLog) snapshot() ([]string, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...), append([]string(nil), l.replayed...)
}

// intercept pauses the page's requests matching urlPattern at stage; fail
// decides, per request, whether the network fails it (connection reset) or
// lets it through. stop ends the interception.
func (p *page) intercept(urlPattern string, stage fetch.RequestStage, fail func(e *fetch.EventRequestPaused) bool) (stop func()) {
	return p.interceptWith(urlPattern, stage, func(e *fetch.EventRequestPaused) requestAction {
		if fail(e) {
			return func(ctx context.Context, t *chromedp.Target) error {
				_, err := cdp.Call(ctx, t, fetch.FailRequest, fetch.FailRequestParams{RequestID: e.RequestID, ErrorReason: network.ErrorReasonConnectionReset})
				return err
			}
		}
		return continueRequest(e)
	})
}

// requestAction answers one paused request in the page's target.
type requestAction func(ctx context.Context, t *chromedp.Target) error

// continueRequest lets a paused request through.
func continueRequest(e *fetch.EventRequestPaused) requestAction {
	return func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: e.RequestID})
		return err
	}
}

// interceptWith pauses the page's requests matching urlPattern at stage and
// answers each with the action decide chooses for it. decide runs on a
// goroutine of its own, so it may evaluate in the page. stop ends the
// interception.
func (p *page) interceptWith(urlPattern string, stage fetch.RequestStage, decide func(e *fetch.EventRequestPaused) requestAction) (stop func()) {
	p.t.Helper()
	ctx, cancel := context.WithCancel(p.ctx)
	evs := make(chan *fetch.EventRequestPaused, 64)
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*fetch.EventRequestPaused); ok {
			evs <- e
		}
	}); err != nil {
		cancel()
		p.t.Fatalf("%s: listen: %v", p.name, err)
	}
	p.do("intercept "+urlPattern, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{
			{URLPattern: urlPattern, RequestStage: stage}}})
		return err
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var e *fetch.EventRequestPaused
			select {
			case <-ctx.Done():
				return
			case e = <-evs:
			}
			_, _ = chromedp.Run(ctx, chromedp.Func(decide(e)))
		}
	}()
	return func() {
		p.do("stop intercepting", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, fetch.Disable, cdp.Empty{})
			return err
		}))
		cancel()
		<-done
	}
}

// loseFirstAnswer makes the network lose the answer to the first request
// with this method matching urlPattern, after the server handled it: the
// page sees a connection reset and cannot know the outcome. Later matching
// requests pass.
func (p *page) loseFirstAnswer(method, urlPattern string) (log *netLog, stop func()) {
	p.t.Helper()
	log = &netLog{}
	lost := false
	stop = p.intercept(urlPattern, fetch.RequestStageResponse, func(e *fetch.EventRequestPaused) bool {
		if e.Request.Method != method {
			return false
		}
		log.mu.Lock()
		log.keys = append(log.keys, headerValue(e.Request.Headers, "Idempotency-Key"))
		log.replayed = append(log.replayed, responseHeader(e.ResponseHeaders, "Idempotent-Replayed"))
		log.mu.Unlock()
		first := !lost
		lost = true
		return first
	})
	return log, stop
}

func headerValue(h network.Headers, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			s, _ := v.(string)
			return s
		}
	}
	return ""
}

func responseHeader(h []*fetch.HeaderEntry, name string) string {
	for _, e := range h {
		if strings.EqualFold(e.Name, name) {
			return e.Value
		}
	}
	return ""
}

// noJSErrors fails when the page threw or logged an error.
func (p *page) noJSErrors() {
	p.t.Helper()
	if errs := p.jsErrors(); len(errs) > 0 {
		p.t.Errorf("%s: JavaScript errors:\n  %s", p.name, strings.Join(errs, "\n  "))
	}
}

func mintToken(t *testing.T, sub string) string {
	t.Helper()
	s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// instanceVars is the environment of one gateway instance on a fixed port,
// so it can be restarted on the same address and its page origin stays
// allowed.
func instanceVars(port int, id, origins string) map[string]string {
	v := baseEnv()
	v["HAN_HTTP_ADDR"] = fmt.Sprintf("127.0.0.1:%d", port)
	v["HAN_INSTANCE_ID"] = id
	v["HAN_ALLOWED_ORIGINS"] = origins
	v["HAN_SHUTDOWN_TIMEOUT"] = "5s"
	return v
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	seen := map[int]bool{}
	var out []int
	for len(out) < n {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}
