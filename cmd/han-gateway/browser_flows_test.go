package main

import (
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// deliveryBound is how long a user may wait for something another user did
// (a message, a typing hint, a presence change) to show up.
const deliveryBound = 5 * time.Second

// TestBrowser runs the web client in one headless Chromium against two
// gateway instances (X and Y) sharing Redis and PostgreSQL: alice uses X,
// bob uses Y, each in a browser context of their own.
func TestBrowser(t *testing.T) {
	b := startBrowser(t)
	ports := freePorts(t, 2)
	origins := fmt.Sprintf("http://127.0.0.1:%d,http://127.0.0.1:%d", ports[0], ports[1])
	varsX := instanceVars(ports[0], "browser-x", origins)
	varsY := instanceVars(ports[1], "browser-y", origins)
	mx := start(t, varsX)
	my := start(t, varsY)
	alice, bob := ids.New(), ids.New()
	aTok, bTok := mintToken(t, alice), mintToken(t, bob)
	// Bob has signed in once, so alice can add him to a dialog.
	if code, body := call(t, "GET", mx.URL()+"/v1/me", bTok, ""); code != 200 {
		t.Fatalf("GET /v1/me for bob: %d %s", code, body)
	}

	t.Run("modules", func(t *testing.T) { browserModuleChecks(t, b, mx) })
	t.Run("chat", func(t *testing.T) { browserChat(t, b, mx, &my, varsY, alice, bob, aTok, bTok) })
	t.Run("console", func(t *testing.T) { browserConsole(t, b, mx, alice, aTok) })
	t.Run("token refresh", func(t *testing.T) { browserTokenRefresh(t, b, mx) })
}

// browserModuleChecks runs the client's pure logic inside the browser, on
// the modules the server embeds and serves: the SDK's per-dialog ordering
// (served under /sdk/), its backoff and refresh timing, the client's
// timeline (loaded window, older pages, duplicates) and TTL tokens. The
// SDK's gap filling, recovery and resync against the real program are its
// Node tests' (TestJavaScriptSDK).
func browserModuleChecks(t *testing.T, b *browser, m *Main) {
	p := b.newPage(t, "modules")
	p.do("open", chromedp.Navigate(m.URL()+"/"))
	p.waitSel(deliveryBound, "sign-in form", "#signin-form")
	got := mustEval[string](p, `(async () => {
		const { DialogState } = await import("/sdk/dialog.js");
		const { backoffDelay, advisedDelay, refreshDelay } = await import("/sdk/realtime.js");
		const { Timeline } = await import("/js/timeline.js");
		const { ttlToken, cachePutBody } = await import("/js/console.js");
		const msg = (s) => ({ id: "m" + s, seq: s, body: "b" + s, senderId: "u", createdAt: s });
		const server = [1, 2, 3, 4, 5].map(msg);
		const out = {};

		// Out of order: delivered in seq order once the gap closes; duplicates dropped.
		const d = new DialogState(0);
		out.delivered = [1, 3, 2, 2, 1, 5].map((s) => d.offer(msg(s)).map((m) => m.seq));
		out.known = d.known;
		out.gapOpen = d.hasGap;

		// The timeline loads the latest window, drops what it holds, pages older history.
		const calls = [];
		const tl = new Timeline({
			pages: async function* (after) { calls.push(after); yield server.filter((m) => m.seq > after); },
			page: async (after, limit) => { calls.push(after); return { items: server.filter((m) => m.seq > after).slice(0, limit), nextCursor: null }; },
		});
		await tl.start(5, 2);
		out.window = tl.messages().map((m) => m.seq);
		out.windowFloor = tl.floor;
		out.dupAdded = tl.add([msg(5), msg(4)]).length;
		await tl.loadOlder(50);
		out.older = tl.messages().map((m) => m.seq);
		out.timelineCalls = calls;

		out.backoff = [backoffDelay(0, () => 1), backoffDelay(3, () => 1), backoffDelay(20, () => 1), backoffDelay(5, () => 0)];
		out.advised = [advisedDelay('{"retryMs":1200}'), advisedDelay("going away")];
		out.refresh = [refreshDelay(1e12 + 120000, 1e12), refreshDelay(1e12 + 30000, 1e12), refreshDelay(1e12 - 5000, 1e12), refreshDelay(1e12 + 40 * 86400e3, 1e12)];
		out.ttl = [ttlToken(""), ttlToken("3600"), ttlToken("1.5"), ttlToken("1e3"), ttlToken("soon")];
		out.body = cachePutBody({ key: "k", type: "string", value: "v", ttl: "1.5", createOnly: true });
		return JSON.stringify(out);
	})()`)
	var res struct {
		Delivered     [][]int   `json:"delivered"`
		Known         int       `json:"known"`
		GapOpen       bool      `json:"gapOpen"`
		Window        []int     `json:"window"`
		WindowFloor   int       `json:"windowFloor"`
		DupAdded      int       `json:"dupAdded"`
		Older         []int     `json:"older"`
		TimelineCalls []int     `json:"timelineCalls"`
		Backoff       []int     `json:"backoff"`
		Advised       []*int    `json:"advised"`
		Refresh       []int     `json:"refresh"`
		TTL           []*string `json:"ttl"`
		Body          string    `json:"body"`
	}
	if err := json.Unmarshal([]byte(got), &res); err != nil {
		t.Fatalf("module checks: %v (%s)", err, got)
	}
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v, want %v", what, got, want)
		}
	}
	check("delivered per offer (seq order, duplicates dropped)", res.Delivered, [][]int{{1}, {}, {2, 3}, {}, {}, {}})
	check("known after reordering", res.Known, 3)
	check("seq 5 waits behind a gap", res.GapOpen, true)
	check("latest window", res.Window, []int{4, 5})
	check("window floor", res.WindowFloor, 3)
	check("messages already held are not added again", res.DupAdded, 0)
	check("older page", res.Older, []int{1, 2, 3, 4, 5})
	check("timeline REST reads (afterSeq)", res.TimelineCalls, []int{3, 0})
	check("backoff (full jitter, 0.5 s doubling, 30 s cap)", res.Backoff, []int{500, 4000, 30000, 0})
	check("token refresh 60 s before expiry, at once when less is left, within setTimeout's range", res.Refresh, []int{60000, 0, 0, 1<<31 - 1})
	if res.Advised[0] == nil || *res.Advised[0] != 1200 || res.Advised[1] != nil {
		t.Errorf("advised delay from a 1001 reason: %v", res.Advised)
	}
	var ttl []string
	for _, s := range res.TTL {
		if s == nil {
			ttl = append(ttl, "<omitted>")
		} else {
			ttl = append(ttl, *s)
		}
	}
	check("TTL tokens", ttl, []string{"<omitted>", "3600", "1.5", "1e3", `"soon"`})
	check("PUT /cache body", res.Body, `{"key":"k","type":"string","value":"v","ttlSeconds":1.5,"createOnly":true}`)
	browserPresentationModules(t, p)
	p.noJSErrors()
}

// messagesShown lists the messages a page shows, in DOM order.
func messagesShown(p *page) []shownMessage {
	p.t.Helper()
	raw := mustEval[string](p, `JSON.stringify(Array.from(document.querySelectorAll("#messages li.msg")).map((li) => ({
		seq: li.dataset.seq ? Number(li.dataset.seq) : 0, pending: li.classList.contains("pending"),
		body: li.querySelector(".body")?.textContent ?? "", atts: li.querySelectorAll(".att").length })))`)
	var out []shownMessage
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		p.t.Fatal(err)
	}
	return out
}

type shownMessage struct {
	Seq     int    `json:"seq"`
	Pending bool   `json:"pending"`
	Body    string `json:"body"`
	Atts    int    `json:"atts"`
}

// assertExactlyOnce: every expected message once, in seq order, nothing pending.
func assertExactlyOnce(t *testing.T, who string, got []shownMessage, bodies []string) {
	t.Helper()
	var seqs []int
	var texts []string
	for _, m := range got {
		if m.Pending {
			t.Errorf("%s still shows a pending copy of %q", who, m.Body)
		}
		seqs = append(seqs, m.Seq)
		texts = append(texts, m.Body)
	}
	var want []int
	for i := range bodies {
		want = append(want, i+1)
	}
	if !reflect.DeepEqual(seqs, want) || !reflect.DeepEqual(texts, bodies) {
		t.Fatalf("%s shows seqs %v bodies %q; want seqs %v bodies %q", who, seqs, texts, want, bodies)
	}
}

func browserChat(t *testing.T, b *browser, mx *Main, my **Main, varsY map[string]string, alice, bob, aTok, bTok string) {
	a := b.newPage(t, "alice")
	bp := b.newPage(t, "bob")

	// Alice opens a dev sign-in link on instance X.
	a.do("open sign-in link", chromedp.Navigate(mx.URL()+"/#token="+aTok))
	a.waitSel(deliveryBound, "the sign-in question", "#link-signin-go")
	a.shot("sign-in-link")
	a.axe("sign-in-link")
	a.confirmLinkSignIn()
	a.waitJS(deliveryBound, "alice live", `document.querySelector("#conn")?.dataset.phase === "live"`)
	if h := mustEval[string](a, "location.hash"); strings.Contains(h, "token") {
		t.Fatalf("the token stayed in the address bar: %s", h)
	}
	if got := a.text("#me-id"); got != alice[len(alice)-8:] {
		t.Fatalf("alice signed in as %q", got)
	}
	a.shot("signed-in")
	a.axe("chat-no-dialogs")
	if got := a.text("#me-avatar"); got != expectedInitials(alice) {
		t.Fatalf("alice's avatar shows %q, want %q", got, expectedInitials(alice))
	}
	if !mustEval[bool](a, `(async () => { const r = await fetch(document.querySelector('link[rel="icon"]').href); return r.ok && r.headers.get("content-type").includes("svg"); })()`) {
		t.Fatal("no favicon served")
	}

	// She starts a dialog with bob.
	a.click("#new-dialog-box summary")
	a.setValue("#new-members", bob)
	a.setValue("#new-title", "Launch plan")
	a.click("#new-dialog button[type=submit]")
	a.waitJS(deliveryBound, "dialog opened", `document.querySelector("#dialog-title")?.textContent === "Launch plan" && location.hash.startsWith("#/chat/")`)
	dialogID := strings.TrimPrefix(mustEval[string](a, "location.hash"), "#/chat/")
	a.axe("chat-empty")

	// Bob pastes his token on instance Y.
	bobFrames := bp.recordWebSocket()
	bp.do("open", chromedp.Navigate((*my).URL()+"/"))
	bp.waitSel(deliveryBound, "sign-in form", "#token")
	bp.shot("sign-in")
	bp.axe("sign-in")
	bp.setValue("#token", bTok)
	bp.click("#signin-btn")
	bp.waitJS(deliveryBound, "bob live", `document.querySelector("#conn")?.dataset.phase === "live"`)
	bp.waitSel(deliveryBound, "dialog listed for bob", fmt.Sprintf(`a.dialog-item[data-dialog=%q]`, dialogID))
	bp.click(fmt.Sprintf(`a.dialog-item[data-dialog=%q]`, dialogID))
	bp.waitJS(deliveryBound, "bob opened the dialog", `document.querySelector("#dialog-title")?.textContent === "Launch plan"`)

	// Presence: alice sees bob's dot turn on.
	bobDot := fmt.Sprintf(`document.querySelector('.member[data-user=%q] .dot')?.dataset.online`, bob)
	a.waitJS(deliveryBound, "bob's presence dot on", bobDot+` === "true"`)

	// Typing: bob sees alice typing. Typing is ephemeral (never replayed),
	// so bob's subscription to the dialog must be in place before alice types.
	testenv.Eventually(t, deliveryBound, func() bool {
		return bobFrames.has(false, `{"type":"subscribed","dialogId":"`+dialogID+`"`)
	}, "bob: no subscribed frame for the dialog")
	a.typeInto("#composer-input", "Hello")
	bp.waitJS(deliveryBound, "bob sees alice typing", fmt.Sprintf(`document.querySelector("#typing").dataset.users.includes(%q) && document.querySelector("#typing").textContent.includes("typing")`, alice))
	bp.shot("sees-typing")

	// A sends, B sees it within the bound.
	a.typeInto("#composer-input", " Bob!")
	a.pressEnter("#composer-input")
	bp.waitSel(deliveryBound, "bob receives message 1", `#messages li.msg[data-seq="1"]`)
	bodies := []string{"Hello Bob!"}
	assertExactlyOnce(t, "bob", messagesShown(bp), bodies)
	a.waitSel(deliveryBound, "alice's message confirmed", `#messages li.msg[data-seq="1"]`)
	a.shot("sent")
	bp.waitJS(deliveryBound, "typing hint gone after the message", `document.querySelector("#typing").dataset.users === ""`)
	bp.shot("received")
	assertSeqHidden(t, bp, 1)
	assertDaySeparators(t, bp, [][2]any{{"Today", 1}})
	if got := bp.text(`#messages li.msg[data-seq="1"] .avatar`); got != expectedInitials(alice) {
		t.Fatalf("bob sees alice's avatar as %q, want %q", got, expectedInitials(alice))
	}
	browserDialogPreview(t, bp, dialogID, alice[len(alice)-8:]+": Hello Bob!")
	browserDialogPreview(t, a, dialogID, "You: Hello Bob!")

	// Bob's instance restarts: his socket is closed (1001 + retryMs) and
	// the instance is gone while alice sends 5 more. Until bob's socket is
	// live again his history requests fail, so what fills his gap is the
	// reconciliation that follows the reconnect, not a REST poll meanwhile.
	stopB := bp.intercept("*/v1/dialogs/*/messages*", fetch.RequestStageRequest, func(e *fetch.EventRequestPaused) bool {
		if e.Request.Method != "GET" {
			return false
		}
		// "resyncing" is the banner of a live socket while it reconciles.
		phase, err := eval[string](bp, `document.querySelector("#conn").dataset.phase`)
		return err != nil || (phase != "live" && phase != "resyncing")
	})
	if err := (*my).Close(); err != nil {
		t.Fatalf("stop instance Y: %v", err)
	}
	bp.waitJS(deliveryBound, "bob's banner says reconnecting", `["reconnecting", "connecting"].includes(document.querySelector("#conn").dataset.phase)`)
	bp.shot("reconnecting")
	a.waitJS(deliveryBound, "bob's presence dot off", bobDot+` === "false"`)
	a.shot("bob-offline")
	for i := 2; i <= 6; i++ {
		body := fmt.Sprintf("Update %d while bob is away", i)
		a.typeInto("#composer-input", body)
		a.pressEnter("#composer-input")
		a.waitSel(deliveryBound, "alice's message confirmed", fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, i))
		bodies = append(bodies, body)
	}
	assertExactlyOnce(t, "alice", messagesShown(a), bodies)

	// Instance Y comes back on the same address; bob reconnects on his own
	// (backoff honouring the advised delay) and reconciles over REST.
	*my = start(t, varsY)
	bp.waitJS(40*time.Second, "bob live again", `document.querySelector("#conn").dataset.phase === "live"`)
	bp.waitSel(deliveryBound, "bob reconciled message 6", `#messages li.msg[data-seq="6"]`)
	assertExactlyOnce(t, "bob after reconnect", messagesShown(bp), bodies)
	// The new socket resubscribed from the last message bob held (the
	// SDK's recovery), so the server could replay what he missed.
	if !bobFrames.has(true, `{"type":"subscribe","dialogId":"`+dialogID+`","sinceSeq":1}`) {
		t.Fatal("bob's reconnect did not resubscribe the dialog with sinceSeq 1")
	}
	stopB()
	bp.shot("reconciled")
	a.waitJS(deliveryBound, "bob's presence dot on again", bobDot+` === "true"`)

	// Live delivery works on the new connection, with an attachment.
	img := writeTestPNG(t)
	a.do("attach", chromedp.SetUploadFiles(chromedp.CSS("#attach-input"), []string{img}))
	a.waitSel(deliveryBound, "attachment uploaded", `#uploads li[data-state="ready"]`)
	a.shot("attachment-ready")
	a.typeInto("#composer-input", "Here is the diagram")
	a.click("#send")
	bodies = append(bodies, "Here is the diagram")
	bp.waitSel(deliveryBound, "bob receives message 7", `#messages li.msg[data-seq="7"]`)
	bp.waitJS(deliveryBound, "bob sees the image preview", `(() => { const i = document.querySelector('#messages li.msg[data-seq="7"] img.att-preview'); return i && !i.hidden && i.complete && i.naturalWidth === 120; })()`)
	assertExactlyOnce(t, "bob", messagesShown(bp), bodies)
	a.waitSel(deliveryBound, "alice's message 7 confirmed", `#messages li.msg[data-seq="7"]`)
	assertExactlyOnce(t, "alice", messagesShown(a), bodies)
	if got := messagesShown(bp)[6].Atts; got != 1 {
		t.Fatalf("bob sees %d attachments on message 7", got)
	}
	bp.shot("attachment-received")

	// The answer to a send is lost after the server committed it: the
	// composer retries with the same Idempotency-Key, the server replays,
	// and the message exists and shows once.
	lost, stop := a.loseFirstAnswer("POST", "*/v1/dialogs/*/messages")
	a.typeInto("#composer-input", "Did the diagram come through?")
	a.pressEnter("#composer-input")
	bodies = append(bodies, "Did the diagram come through?")
	testenv.Eventually(t, deliveryBound, func() bool { keys, _ := lost.snapshot(); return len(keys) >= 2 },
		"the send was not retried after its answer was lost")
	stop()
	keys, replayed := lost.snapshot()
	if keys[0] == "" || keys[1] != keys[0] {
		t.Fatalf("retry used Idempotency-Key %q after %q; want the same key", keys[1], keys[0])
	}
	if replayed[1] != "true" {
		t.Fatalf("the retry was not answered from the idempotency record (Idempotent-Replayed %q)", replayed[1])
	}
	a.waitJS(deliveryBound, "alice's retried message confirmed", `document.querySelector('#messages li.msg[data-seq="8"]') && !document.querySelector("#messages li.pending")`)
	bp.waitSel(deliveryBound, "bob receives message 8", `#messages li.msg[data-seq="8"]`)
	assertExactlyOnce(t, "alice", messagesShown(a), bodies)
	assertExactlyOnce(t, "bob", messagesShown(bp), bodies)
	a.shot("chat-desktop")
	a.axe("chat-messages")
	bodies = append(bodies, browserFailedSends(t, a, len(bodies)+1))
	bp.waitSel(deliveryBound, "bob receives the retried message", fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, len(bodies)))
	assertExactlyOnce(t, "alice after the failed sends", messagesShown(a), bodies)
	bodies = append(bodies, browserSendWrittenThenFailed(t, a, len(bodies)+1))
	bp.waitSel(deliveryBound, "bob receives the message whose answers were lost", fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, len(bodies)))
	assertExactlyOnce(t, "alice after a send written but answered with failures", messagesShown(a), bodies)
	browserDialogPreview(t, bp, dialogID, alice[len(alice)-8:]+": "+bodies[len(bodies)-1])

	// The history in PostgreSQL is what both pages show.
	code, body := call(t, "GET", mx.URL()+"/v1/dialogs/"+dialogID+"/messages?afterSeq=0", bTok, "")
	if code != 200 {
		t.Fatalf("history: %d %s", code, body)
	}
	var hist struct {
		Items []struct {
			Seq  int    `json:"seq"`
			Body string `json:"body"`
		} `json:"items"`
	}
	_ = json.Unmarshal([]byte(body), &hist)
	if len(hist.Items) != len(bodies) {
		t.Fatalf("server holds %d messages, want %d (a retry must never create a second one)", len(hist.Items), len(bodies))
	}
	// On a phone-sized screen the conversation fills the width.
	bp.do("phone viewport", chromedp.EmulateViewport(390, 844))
	bp.waitJS(deliveryBound, "no horizontal scrolling on a phone", `document.documentElement.scrollWidth <= window.innerWidth`)
	bp.shot("chat-390px")
	bp.axe("chat-messages-390px")

	// Messages of yesterday sit under "Yesterday", today's under "Today"
	// (a fresh page reads them back with their new times).
	shiftDay(t, mx, dialogID, 3)
	b2 := b.newPage(t, "bob-next-day")
	b2.do("open sign-in link", chromedp.Navigate(mx.URL()+"/#token="+bTok))
	b2.confirmLinkSignIn()
	b2.waitJS(deliveryBound, "bob live", `document.querySelector("#conn")?.dataset.phase === "live"`)
	// A fresh page's preview is the listing's lastMessage: no history is
	// read before a dialog is opened.
	browserDialogPreview(t, b2, dialogID, alice[len(alice)-8:]+": "+bodies[len(bodies)-1])
	browserNoHistoryReads(t, b2)
	_ = mustEval[bool](b2, fmt.Sprintf(`(location.hash = "#/chat/%s", true)`, dialogID))
	b2.waitSel(deliveryBound, "history shown", fmt.Sprintf(`#messages li.msg[data-seq="%d"]`, len(bodies)))
	assertDaySeparators(t, b2, [][2]any{{"Yesterday", 1}, {"Today", 4}})
	b2.shot("yesterday-and-today")
	a.noJSErrors()
	bp.noJSErrors()
	b2.noJSErrors()
}

func writeTestPNG(t *testing.T) string {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 120, 80))
	for y := range 80 {
		for x := range 120 {
			img.Set(x, y, color.RGBA{R: uint8(40 + x), G: uint8(85 + y), B: 214, A: 255})
		}
	}
	path := filepath.Join(t.TempDir(), "diagram.png")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func browserConsole(t *testing.T, b *browser, mx *Main, alice, aTok string) {
	pid := ids.New()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A reader of the project (signed in once, so the user exists).
	reader := ids.New()
	rTok := mintToken(t, reader)
	if code, body := call(t, "GET", mx.URL()+"/v1/me", rTok, ""); code != 200 {
		t.Fatalf("GET /v1/me for the reader: %d %s", code, body)
	}
	if err := store.New(mx.pg).CreateProject(ctx, pid, "Browser project", []store.ProjectMember{
		{UserID: alice, Role: store.RoleAdmin}, {UserID: reader, Role: store.RoleRead}}); err != nil {
		t.Fatal(err)
	}
	// An entry saved as "never expire" before the upgrade (legacy v1 container without a TTL).
	if err := project.ImportLegacyCache(ctx, mx.rdb, project.NewKeys(mx.Config.Env, pid),
		[]project.LegacyEntry{{Key: "legacy:banner", Type: "string", Value: "Welcome back"}}, 0); err != nil {
		t.Fatal(err)
	}
	p := b.newPage(t, "console")
	p.do("open console link", chromedp.Navigate(mx.URL()+"/#token="+aTok+"&project="+pid))
	p.confirmLinkSignIn()
	p.waitJS(deliveryBound, "snapshot shown", `document.querySelector("#project-role")?.textContent === "admin"`)
	if got := p.text("#eviction-policy"); got != "noeviction" {
		t.Fatalf("eviction policy shown: %q", got)
	}
	legacy := `#cache-rows tr[data-key="legacy:banner"]`
	p.waitSel(deliveryBound, "legacy entry listed", legacy)
	if got := p.text(legacy + " .expires-cell"); !strings.Contains(got, "legacy · no expiry") || !strings.Contains(got, "deadline pending") {
		t.Fatalf("legacy flags shown as %q", got)
	}
	p.shot("console-desktop")
	p.axe("console-cache")
	if unit, hint := p.text("#quota-unit"), p.text("#quota-hint"); unit != "bytes" || !strings.Contains(hint, "per entry") {
		t.Fatalf("quota input unit %q, hint %q", unit, hint)
	}
	if p.visible("#read-only-note") {
		t.Fatal("an admin is told the project is read-only")
	}

	// Put a cache entry with a TTL and see it listed with its expiry.
	p.setValue("#cache-key", "session:alice")
	p.setValue("#cache-value", "signed-in")
	p.setValue("#cache-ttl", "3600")
	before := time.Now()
	p.click("#cache-save")
	p.waitSel(deliveryBound, "put confirmed", "#cache-put-ok")
	after := time.Now()
	row := `#cache-rows tr[data-key="session:alice"]`
	p.waitSel(deliveryBound, "entry listed", row)
	exp := mustEval[float64](p, fmt.Sprintf(`Number(document.querySelector(%q).dataset.expiresAt)`, row))
	lo, hi := before.Add(time.Hour-2*time.Second).UnixMilli(), after.Add(time.Hour+2*time.Second).UnixMilli()
	if int64(exp) < lo || int64(exp) > hi {
		t.Fatalf("listed expiresAt %v, want within [%d, %d] (now + 3600 s)", exp, lo, hi)
	}
	shown := p.text(row + " time.expires")
	want := mustEval[string](p, fmt.Sprintf(`new Intl.DateTimeFormat(undefined, {dateStyle: "medium", timeStyle: "medium"}).format(new Date(%d))`, int64(exp)))
	if shown != want || shown == "" {
		t.Fatalf("expiry shown as %q, want local time %q", shown, want)
	}
	if rel := p.text(row + " .rel"); rel != "in 60 min" {
		t.Fatalf("relative expiry %q", rel)
	}
	code, body := call(t, "GET", mx.URL()+"/projects/"+pid+"/redis/cache?search=session", aTok, "")
	if code != 200 || !strings.Contains(body, fmt.Sprintf(`"expiresAt":%d`, int64(exp))) {
		t.Fatalf("the page shows an expiry the server does not hold: %d %s", code, body)
	}
	// That write fixed the legacy deadline: no longer pending.
	if got := p.text(legacy + " .expires-cell"); !strings.Contains(got, "legacy · no expiry") || strings.Contains(got, "pending") {
		t.Fatalf("legacy flags after the first write: %q", got)
	}
	p.shot("cache-entry")

	// An invalid TTL is sent as typed and the server's stable code shown.
	p.setValue("#cache-key", "session:bad")
	p.setValue("#cache-ttl", "1.5")
	p.click("#cache-save")
	p.waitSel(deliveryBound, "error shown", `#cache-put-error[data-code="invalid_cache_ttl"]`)
	if txt := p.text("#cache-put-error"); !strings.Contains(txt, "invalid_cache_ttl") || !strings.Contains(txt, "whole number of seconds") {
		t.Fatalf("error shown as %q", txt)
	}
	if code, body := call(t, "GET", mx.URL()+"/projects/"+pid+"/redis/cache?search=bad", aTok, ""); code != 200 || strings.Contains(body, "session:bad") {
		t.Fatalf("an invalid TTL wrote something: %d %s", code, body)
	}
	p.shot("invalid-ttl")

	// createOnly on an existing key is refused atomically by the server.
	p.setValue("#cache-key", "session:alice")
	p.setValue("#cache-ttl", "60")
	p.click("#cache-create-only")
	p.click("#cache-save")
	p.waitSel(deliveryBound, "conflict shown", `#cache-put-error[data-code="cache_key_exists"]`)
	p.click("#cache-create-only")

	// Delete is two-step.
	del := row + ` button[aria-label="Delete session:alice"]`
	p.click(del)
	p.waitJS(deliveryBound, "delete armed", fmt.Sprintf(`document.querySelector(%q).textContent === "Confirm delete"`, del))
	p.click(del)
	p.waitJS(deliveryBound, "row removed", fmt.Sprintf(`!document.querySelector(%q)`, row))
	if code, body := call(t, "GET", mx.URL()+"/projects/"+pid+"/redis/cache?search=session", aTok, ""); code != 200 || strings.Contains(body, "session:alice") {
		t.Fatalf("deleted entry still listed by the API: %d %s", code, body)
	}

	// Topic + subscription, publish, claim, ack processed, receipt.
	p.showTab("topics")
	// No topic yet: the publish drop-down says so and nothing can be sent.
	if opt := p.text("#publish-topic option"); !strings.Contains(opt, "No topics yet") || !p.visible("#publish-empty") ||
		!mustEval[bool](p, `document.querySelector("#publish-send").disabled`) {
		t.Fatalf("empty publish drop-down: option %q, hint shown %v", opt, p.visible("#publish-empty"))
	}
	p.setValue("#topic-name", "orders")
	p.setValue("#topic-desc", "Orders placed in the shop")
	p.click("#topic-create button[type=submit]")
	p.waitSel(deliveryBound, "topic listed", `#topic-rows tr[data-name="orders"]`)
	p.setValue("#sub-name", "billing")
	p.click("#sub-create button[type=submit]")
	p.waitSel(deliveryBound, "subscription listed and selected", `#sub-rows tr.selected[data-name="billing"]`)
	p.setValue("#publish-payload", `{"orderId": 42, "total": 19.9}`)
	p.click("#publish-send")
	p.waitSel(deliveryBound, "published", "#publish-ok")
	msgID := mustEval[string](p, `document.querySelector("#publish-ok").dataset.messageId`)
	p.waitSel(deliveryBound, "message listed in the topic", fmt.Sprintf(`#topic-message-rows tr[data-message-id=%q]`, msgID))
	p.shot("published")
	p.axe("console-topics")
	p.showTab("work")
	p.waitSel(deliveryBound, "receipt pending", fmt.Sprintf(`#receipt-rows tr[data-message-id=%q][data-status="pending"]`, msgID))
	p.click("#claim-send")
	claim := fmt.Sprintf(`#claims li[data-message-id=%q]`, msgID)
	p.waitSel(deliveryBound, "claimed", claim)
	p.waitJS(deliveryBound, "lease countdown", fmt.Sprintf(`/^lease 0:[0-5]\d left$|^lease 1:00 left$/.test(document.querySelector(%q).textContent)`, claim+" .lease"))
	p.waitSel(deliveryBound, "receipt leased", fmt.Sprintf(`#receipt-rows tr[data-message-id=%q][data-status="leased"]`, msgID))
	p.shot("claimed")
	p.axe("console-claims")
	p.setValue(fmt.Sprintf("#result-%s", msgID), "charged")
	p.click(claim + " .ack-processed")
	p.waitSel(deliveryBound, "ack shown", claim+` [data-receipt-status="processed"]`)
	p.waitSel(deliveryBound, "receipt processed", fmt.Sprintf(`#receipt-rows tr[data-message-id=%q][data-status="processed"]`, msgID))
	if got := p.text(fmt.Sprintf(`#receipt-rows tr[data-message-id=%q] td.value-cell`, msgID)); got != "charged" {
		t.Fatalf("receipt result shown: %q", got)
	}
	p.waitJS(deliveryBound, "budget shows the reliable bytes", `!/^0 B of/.test(document.querySelector("#budget").textContent)`)
	p.shot("receipt")
	if mustEval[bool](p, `document.querySelector("#publish-send").disabled`) {
		t.Fatal("publishing stays disabled with a topic")
	}
	p.do("phone viewport", chromedp.EmulateViewport(390, 844))
	p.waitJS(deliveryBound, "no horizontal scrolling on a phone", `document.documentElement.scrollWidth <= window.innerWidth`)
	p.showTab("cache")
	assertCacheTableFits(t, p, legacy)
	_ = mustEval[bool](p, `(document.querySelector("#cache-table").scrollIntoView({ block: "center" }), true)`)
	p.shot("console-390px")
	p.axe("console-cache-390px")
	p.noJSErrors()

	browserReadOnlyConsole(t, b, mx, pid, rTok)
}
