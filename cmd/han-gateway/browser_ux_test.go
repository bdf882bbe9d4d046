package main

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/han-app/gateway/internal/testenv"
)

// Checks of the client's presentation: what a person sees (day
// separators, previews, initials, where a failure shows, what a reader may
// use), asserted on the DOM.

// browserPresentationModules checks the client's pure presentation helpers
// in the browser: which failed sends offer Retry, avatar initials and day
// labels.
func browserPresentationModules(t *testing.T, p *page) {
	got := mustEval[string](p, `(async () => {
		const { canRetry, mayHaveWritten } = await import("/js/chat.js");
		const { initials, dayLabel } = await import("/js/dom.js");
		const e = (code, status) => ({ code, status });
		const now = new Date(2026, 11, 2, 10, 0).getTime();
		const full = new Intl.DateTimeFormat(undefined, { weekday: "long", day: "numeric", month: "long", year: "numeric" });
		return JSON.stringify({
			retry: [e("invalid_body", 400), e("idempotency_key_reused", 409), e("dialog_not_found", 404), e("forbidden", 403),
				e("payload_too_large", 413), e("idempotency_in_progress", 409), e("http_408", 408), e("rate_limited", 429),
				e("network_error", 0), e("internal", 500), e("database_unavailable", 503)].map(canRetry),
			written: [e("network_error", 0), e("internal", 500), e("bad_gateway", 502), e("http_504", 504), e("database_unavailable", 503),
				e("idempotency_in_progress", 409), e("database_busy", 503), e("dialog_busy", 503), e("rate_limited", 429),
				e("invalid_body", 400)].map(mayHaveWritten),
			initials: [initials(null, "00000000-0000-7000-8000-00000000a11c"), initials(null, "00000000-0000-7000-8000-000000000b0b"),
				initials("Launch plan", "x"), initials("Alice & Bob", "x"), initials("notes", "x"), initials(null, "00000000-0000-7000-8000-000000000000")],
			days: [dayLabel(now - 3600e3, now), dayLabel(new Date(2026, 11, 1, 23, 59).getTime(), now),
				dayLabel(new Date(2026, 10, 30, 12).getTime(), now) === full.format(new Date(2026, 10, 30, 12))],
		});
	})()`)
	var res struct {
		Retry    []bool   `json:"retry"`
		Written  []bool   `json:"written"`
		Initials []string `json:"initials"`
		Days     []any    `json:"days"`
	}
	if err := json.Unmarshal([]byte(got), &res); err != nil {
		t.Fatalf("presentation checks: %v (%s)", err, got)
	}
	if want := []bool{false, false, false, false, false, true, true, true, true, true, true}; !reflect.DeepEqual(res.Retry, want) {
		t.Errorf("Retry offered for (invalid_body, key_reused, not_found, forbidden, 413, in_progress, 408, 429, network, 500, 503): %v, want %v", res.Retry, want)
	}
	// A failed send is hidden by a same-body message only when one of its
	// tries may have written it.
	if want := []bool{true, true, true, true, true, true, false, false, false, false}; !reflect.DeepEqual(res.Written, want) {
		t.Errorf("may have written (network, 500, 502, 504, database_unavailable, in_progress, database_busy, dialog_busy, 429, 400): %v, want %v", res.Written, want)
	}
	if want := []string{"A1", "B0", "LP", "AB", "NO", "0"}; !reflect.DeepEqual(res.Initials, want) {
		t.Errorf("initials %q, want %q", res.Initials, want)
	}
	if want := []any{"Today", "Yesterday", true}; !reflect.DeepEqual(res.Days, want) {
		t.Errorf("day labels %v, want %v (today, yesterday, else the full date)", res.Days, want)
	}
}

// expectedInitials mirrors the client's rule for an id without a name.
func expectedInitials(id string) string {
	s := strings.ReplaceAll(id, "-", "")
	s = strings.TrimLeft(s[len(s)-8:], "0")
	if s == "" {
		s = "0"
	}
	if len(s) > 2 {
		s = s[:2]
	}
	return strings.ToUpper(s)
}

// assertSeqHidden: a message's seq number is not shown until the pointer
// is over the message; its tooltip carries it with the full date.
func assertSeqHidden(t *testing.T, p *page, seq int) {
	t.Helper()
	li := fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, seq)
	if d := mustEval[string](p, fmt.Sprintf(`getComputedStyle(document.querySelector('%s .seq')).display`, li)); d != "none" {
		t.Fatalf("%s: #%d is shown (display %q) without hovering", p.name, seq, d)
	}
	if title := mustEval[string](p, fmt.Sprintf(`document.querySelector('%s').title`, li)); !strings.HasPrefix(title, fmt.Sprintf("#%d · ", seq)) {
		t.Fatalf("%s: message tooltip %q lacks the seq", p.name, title)
	}
	p.hover(li + " .bubble")
	p.waitJS(deliveryBound, "seq shown on hover", fmt.Sprintf(`getComputedStyle(document.querySelector('%s .seq')).display !== "none"`, li))
	p.hover("#composer-input")
}

// hover moves the mouse over the centre of the element sel matches.
func (p *page) hover(sel string) {
	p.t.Helper()
	raw := mustEval[string](p, fmt.Sprintf(`(() => { const el = document.querySelector(%q); el.scrollIntoView({ block: "nearest" });
		const r = el.getBoundingClientRect(); return JSON.stringify([r.left + r.width / 2, r.top + r.height / 2]); })()`, sel))
	var xy [2]float64
	if err := json.Unmarshal([]byte(raw), &xy); err != nil {
		p.t.Fatal(err)
	}
	p.do("hover "+sel, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, input.DispatchMouseEvent, input.DispatchMouseEventParams{Type: input.DispatchMouseEventTypeMouseMoved, X: xy[0], Y: xy[1]})
		return err
	}))
}

// answerNext answers the page's next request with this method matching
// urlPattern itself, with status and a JSON body, without reaching the
// server; later requests pass. stop ends the interception.
func (p *page) answerNext(method, urlPattern string, status int, body string) (stop func()) {
	p.t.Helper()
	answered := false
	return p.interceptWith(urlPattern, fetch.RequestStageRequest, func(e *fetch.EventRequestPaused) requestAction {
		if answered || e.Request.Method != method {
			return continueRequest(e)
		}
		answered = true
		return func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: e.RequestID, ResponseCode: int64(status),
				ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/json"}},
				Body:            []byte(body)})
			return err
		}
	})
}

// browserFailedSends: a send the server cannot take (a body over 4000
// characters, invalid_body) fails with its reason under the bubble, in
// view however long the body, and offers no Retry; a failure a retry may
// fix (here a 500) offers Retry, which sends the message. It returns the
// body that was sent in the end.
func browserFailedSends(t *testing.T, a *page, nextSeq int) string {
	stop := a.answerNext("POST", "*/v1/dialogs/*/messages", 500, `{"error":"internal"}`)
	body := "Is the plan final?"
	a.typeInto("#composer-input", body)
	a.pressEnter("#composer-input")
	retryable := `#messages li.pending-failed .send-failed[data-code="internal"]`
	a.waitSel(deliveryBound, "a 500 shows as failed", retryable)
	stop()
	if !mustEval[bool](a, fmt.Sprintf(`!!document.querySelector('%s .send-retry')`, retryable)) {
		t.Fatal("a send that failed with 500 offers no Retry")
	}

	long := strings.Repeat("This plan needs a long explanation. ", 120)[:4001]
	a.setValue("#composer-input", long)
	a.pressEnter("#composer-input")
	failed := `#messages li.pending-failed .send-failed[data-code="invalid_body"]`
	a.waitSel(deliveryBound, "invalid_body shown", failed)
	if txt := a.text(failed); !strings.Contains(txt, "1 to 4000 characters") {
		t.Fatalf("failure reason shown as %q", txt)
	}
	if mustEval[bool](a, fmt.Sprintf(`!!document.querySelector('%s .send-retry')`, failed)) {
		t.Fatal("invalid_body offers Retry: retrying cannot fix it")
	}
	// The reason and its actions are in view, under the bubble, although
	// the body is taller than the list: they come after it in the DOM and
	// lie inside the visible part of the scroller.
	inView := mustEval[string](a, fmt.Sprintf(`(() => { const f = document.querySelector('%s'); const li = f.closest("li");
		const sc = document.querySelector("#messages-scroll").getBoundingClientRect(); const r = f.getBoundingClientRect();
		const b = li.querySelector(".bubble").getBoundingClientRect();
		return JSON.stringify({ inView: r.top >= sc.top && r.bottom <= sc.bottom + 1, below: r.top >= b.bottom - 1, tall: b.top < sc.top,
			discard: !!f.querySelector(".send-discard") }); })()`, failed))
	if inView != `{"inView":true,"below":true,"tall":true,"discard":true}` {
		t.Fatalf("failed long send: %s (want the reason in view, under a bubble taller than the list, with Discard)", inView)
	}
	a.shot("chat-failed-send-desktop")
	a.axe("chat-failed-send")

	a.click(failed + " .send-discard")
	a.waitJS(deliveryBound, "discarded", fmt.Sprintf(`!document.querySelector('%s')`, failed))
	a.click(retryable + " .send-retry")
	a.waitSel(deliveryBound, "the retried message is confirmed", fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, nextSeq))
	a.waitJS(deliveryBound, "no failed message left", `!document.querySelector("#messages li.pending")`)
	return body
}

// browserSendWrittenThenFailed: the first try of a send is written but its
// answer is lost, and every retry is answered 503 database_unavailable
// until the composer gives up. The message itself arrives over the socket
// meanwhile: it shows once, with no failed copy beside it. It returns the
// body that was sent.
func browserSendWrittenThenFailed(t *testing.T, a *page, seq int) string {
	var mu sync.Mutex
	tries := 0
	stop := a.interceptWith("*/v1/dialogs/*/messages", fetch.RequestStageResponse, func(e *fetch.EventRequestPaused) requestAction {
		if e.Request.Method != "POST" {
			return continueRequest(e)
		}
		mu.Lock()
		tries++
		first := tries == 1
		mu.Unlock()
		return func(ctx context.Context, tg *chromedp.Target) error {
			if first {
				_, err := cdp.Call(ctx, tg, fetch.FailRequest, fetch.FailRequestParams{RequestID: e.RequestID, ErrorReason: network.ErrorReasonConnectionReset})
				return err
			}
			_, err := cdp.Call(ctx, tg, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: e.RequestID, ResponseCode: 503,
				ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/json"}, {Name: "Retry-After", Value: "1"}},
				Body:            []byte(`{"error":"database_unavailable"}`)})
			return err
		}
	})
	defer stop()
	body := "Written, though every answer was lost or refused"
	a.typeInto("#composer-input", body)
	a.pressEnter("#composer-input")
	a.waitSel(deliveryBound, "the written message arrives over the socket", fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, seq))
	testenv.Eventually(t, 2*deliveryBound, func() bool { mu.Lock(); defer mu.Unlock(); return tries >= 6 },
		"the composer did not try the send six times")
	// Look once the composer has settled the send (its data-sending count
	// is back to 0): hidden or failed, nothing changes after that.
	a.waitJS(deliveryBound, "the composer settled the send", `document.querySelector("#composer").dataset.sending === "0"`)
	got := mustEval[string](a, `JSON.stringify({ pending: document.querySelectorAll("#messages li.pending").length,
		failed: document.querySelectorAll("#messages li.pending-failed").length })`)
	if got != `{"pending":0,"failed":0}` {
		t.Fatalf("a message that arrived while its send failed: %s, want no pending or failed copy", got)
	}
	return body
}

// assertDaySeparators: the separators before the messages, in order, as
// [label, seq of the first message after it].
func assertDaySeparators(t *testing.T, p *page, want [][2]any) {
	t.Helper()
	raw := mustEval[string](p, `JSON.stringify(Array.from(document.querySelectorAll("#messages li.day-sep")).map((li) => {
		let n = li.nextElementSibling; while (n && !n.classList.contains("msg")) n = n.nextElementSibling;
		return [li.textContent.trim(), n ? Number(n.dataset.seq) : 0]; }))`)
	var got [][2]any
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i][1] = int(got[i][1].(float64))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: day separators %v, want %v", p.name, got, want)
	}
}

// browserNoHistoryReads: the page listed its dialogs and read no message
// history (the listing carries each dialog's last message).
func browserNoHistoryReads(t *testing.T, p *page) {
	t.Helper()
	lists := mustEval[int](p, `performance.getEntriesByType("resource").filter((e) => new URL(e.name).pathname === "/v1/dialogs").length`)
	reads := mustEval[[]string](p, `performance.getEntriesByType("resource").map((e) => e.name).filter((u) => u.includes("/messages"))`)
	if lists == 0 || len(reads) != 0 {
		t.Fatalf("%s: %d listing reads, history reads %v; want the listing and no history read", p.name, lists, reads)
	}
}

// browserDialogPreview: the dialog list shows the last message and its
// time, not a message count.
func browserDialogPreview(t *testing.T, p *page, dialogID, want string) {
	t.Helper()
	item := fmt.Sprintf(`a.dialog-item[data-dialog=%q]`, dialogID)
	p.waitJS(deliveryBound, "dialog list preview", fmt.Sprintf(`document.querySelector('%s .dialog-sub')?.textContent === %q`, item, want))
	if tm := p.text(item + " time.dialog-time"); tm == "" || strings.Contains(p.text(item), "messages") {
		t.Fatalf("%s: dialog list item %q: want a time and no message count", p.name, p.text(item))
	}
}

// shiftDay moves a dialog's first messages one day back in PostgreSQL, so
// a fresh page shows them under "Yesterday".
func shiftDay(t *testing.T, m *Main, dialogID string, throughSeq int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := m.pg.Exec(ctx, `UPDATE messages SET created_at = created_at - interval '1 day' WHERE dialog_id = $1 AND seq <= $2`, dialogID, throughSeq); err != nil {
		t.Fatal(err)
	}
}

// visible: the element exists and takes space (not hidden).
func (p *page) visible(sel string) bool {
	p.t.Helper()
	return mustEval[bool](p, fmt.Sprintf(`(() => { const el = document.querySelector(%q); return !!el && el.getClientRects().length > 0; })()`, sel))
}

// assertCacheTableFits: on a narrow screen every cell of a cache row lies
// inside the table's box (nothing cut off or scrolled away) and its
// actions can be reached.
func assertCacheTableFits(t *testing.T, p *page, row string) {
	t.Helper()
	raw := mustEval[string](p, fmt.Sprintf(`(() => { const wrap = document.querySelector("#cache-table").closest(".table-wrap");
		const w = wrap.getBoundingClientRect(); const out = [];
		if (wrap.scrollWidth > wrap.clientWidth + 1) out.push("the table scrolls sideways: " + wrap.scrollWidth + " > " + wrap.clientWidth);
		for (const c of document.querySelectorAll('%s > *')) { const r = c.getBoundingClientRect();
			if (r.width === 0 || r.left < w.left - 1 || r.right > w.right + 1) out.push((c.dataset.label || c.className) + " at " + Math.round(r.left) + ".." + Math.round(r.right)); }
		const del = document.querySelector('%s .danger').getBoundingClientRect();
		if (del.right > window.innerWidth) out.push("Delete off screen");
		return JSON.stringify(out); })()`, row, row))
	if raw != "[]" {
		t.Fatalf("cache table at %d px: %s", mustEval[int](p, "window.innerWidth"), raw)
	}
}

// browserReadOnlyConsole: a reader sees why writing is disabled, and every
// form and row action that writes is disabled.
func browserReadOnlyConsole(t *testing.T, b *browser, mx *Main, pid, rTok string) {
	p := b.newPage(t, "reader")
	p.do("open console link", chromedp.Navigate(mx.URL()+"/#token="+rTok+"&project="+pid))
	p.confirmLinkSignIn()
	p.waitJS(deliveryBound, "snapshot shown", `document.querySelector("#project-role")?.textContent === "read"`)
	p.waitSel(deliveryBound, "cache listed", `#cache-rows tr[data-key="legacy:banner"]`)
	if !p.visible("#read-only-note") || !strings.Contains(p.text("#read-only-note"), "needs the write role") {
		t.Fatalf("read-only note: shown %v, text %q", p.visible("#read-only-note"), p.text("#read-only-note"))
	}
	enabled := func() string {
		return mustEval[string](p, `JSON.stringify(Array.from(document.querySelectorAll(
			"#cache-put input, #cache-put select, #cache-put textarea, #cache-put button, #cache-rows button, #delivery-toggle, " +
			"#topic-create input, #topic-create button, #sub-create select, #sub-create input, #sub-create button, " +
			"#publish-form input, #publish-form select, #publish-form textarea, #publish-form button, #topic-rows .danger, " +
			"#topic-rows button:not(:first-child), #sub-rows .danger, #claim-form input, #claim-form button[type=submit]"))
			.filter((el) => !el.disabled).map((el) => el.id || el.getAttribute("aria-label") || el.textContent.trim()))`)
	}
	if got := enabled(); got != "[]" {
		t.Fatalf("a reader can use %s", got)
	}
	if title := mustEval[string](p, `document.querySelector("#cache-save").title`); !strings.Contains(title, "write role") {
		t.Fatalf("disabled Save says %q", title)
	}
	p.axe("console-read-only")
	p.shot("console-read-only")
	p.showTab("topics")
	p.waitSel(deliveryBound, "topic listed", `#topic-rows tr[data-name="orders"]`)
	p.click(`#sub-rows tr[data-name="billing"] button`)
	p.waitSel(deliveryBound, "receipts listed", `#receipt-rows tr[data-status]`)
	if got := enabled(); got != "[]" {
		t.Fatalf("a reader can use %s", got)
	}
	p.axe("console-read-only-claims")
	p.noJSErrors()
}

// showTab opens a console tab and waits for its panel. A click can land on
// the sticky top bar when the tab was scrolled under it; the tab is
// clicked again then (opening a tab twice is harmless).
func (p *page) showTab(name string) {
	p.t.Helper()
	shown := fmt.Sprintf(`!document.querySelector("#panel-%s").hidden`, name)
	for range 3 {
		p.click("#tab-" + name)
		for range 10 {
			if ok, err := eval[bool](p, shown); err == nil && ok {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	p.t.Fatalf("%s: tab %s not shown", p.name, name)
}
