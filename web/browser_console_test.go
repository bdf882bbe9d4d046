package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/han-app/gateway/web"
)

const (
	consoleProject = "00000000-0000-4000-8000-00000000b001"
	consoleTopic   = "00000000-0000-4000-8000-00000000b0b1"
	// A name that another writer of the project chose: a right-to-left
	// override with no end, which reorders whatever follows it in the
	// same run of text.
	overrideName = "orders\u202e"
)

// consoleAPI serves the client and a writer's view of one project with
// one topic named overrideName: cache writes, publishes and trims succeed.
func consoleAPI(t *testing.T) *httptest.Server {
	base := "/projects/" + consoleProject + "/redis"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if !strings.HasPrefix(p, "/v1/") && !strings.HasPrefix(p, "/projects/") {
			web.Handler("").ServeHTTP(w, r)
			return
		}
		reply := func(code int, v any) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(v)
		}
		now := time.Now().UnixMilli()
		switch {
		case p == "/v1/me":
			reply(200, map[string]any{"id": aliceID})
		case p == "/v1/public/config":
			reply(200, map[string]any{"realtimeUrl": nil})
		case p == "/v1/dialogs":
			reply(200, map[string]any{"items": []any{}, "nextCursor": nil})
		case p == base+"/":
			reply(200, map[string]any{
				"permissions":   map[string]any{"role": "writer", "write": true},
				"runtime":       map[string]any{"evictionPolicy": "noeviction", "writesAllowed": true, "deliveryPaused": false},
				"cache":         map[string]any{"entries": 0, "usageBytes": 0, "quotaBytes": 65536},
				"budget":        map[string]any{"usedBytes": 0, "limitBytes": 1 << 20, "moduleLimitBytes": 1 << 30},
				"topics":        []any{map[string]any{"id": consoleTopic, "name": overrideName, "createdAt": now}},
				"subscriptions": []any{},
			})
		case p == base+"/cache" && r.Method == http.MethodPut:
			var in struct{ Key string }
			_ = json.NewDecoder(r.Body).Decode(&in)
			reply(201, map[string]any{"key": in.Key, "expiresAt": now + 86400e3})
		case p == base+"/cache":
			reply(200, map[string]any{"items": []any{}, "nextCursor": nil})
		case p == base+"/topics/"+consoleTopic+"/trim":
			reply(200, map[string]any{"trimmed": 3, "releasedBytes": 2048})
		case p == base+"/topics/"+consoleTopic+"/messages" && r.Method == http.MethodPost:
			reply(201, map[string]any{"id": "00000000-0000-4000-8000-00000000e001", "sizeBytes": 17})
		case p == base+"/topics/"+consoleTopic+"/messages":
			reply(200, map[string]any{"items": []any{}, "nextCursor": nil})
		default:
			reply(404, map[string]any{"error": "not_found"})
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// readsLeftToRight reports whether the text after a name in the element
// sel (the text node holding after) lays out left to right: its first
// character left of its last.
func readsLeftToRight(t *testing.T, ctx context.Context, sel, after string) bool {
	t.Helper()
	return evalJS[bool](t, ctx, `(() => {
		const root = document.querySelector(`+jsString(sel)+`);
		const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
		for (let n = walk.nextNode(); n; n = walk.nextNode()) {
			const i = n.data.indexOf(`+jsString(after)+`);
			if (i < 0) continue;
			const at = (k) => { const r = document.createRange(); r.setStart(n, k); r.setEnd(n, k + 1); return r.getBoundingClientRect().left; };
			return at(i) < at(i + `+jsInt(int64(len(after)))+` - 1);
		}
		throw new Error("no text " + `+jsString(after)+` + " in " + root.textContent);
	})()`)
}

// A name someone else chose (a topic's, a cache key) that sits inside a
// sentence of the console is isolated from it: a right-to-left override
// in it reorders the name alone, so "released 2.0 KiB" or "expires …"
// after it still reads as written and cannot be made to say something
// else. Names alone in their cell or heading need no more: the element
// ends the override.
func TestANameInASentenceCannotReorderTheRestOfIt(t *testing.T) {
	ctx := startChromium(t)
	srv := consoleAPI(t)
	c, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(srv.URL+"/#token=x&project="+consoleProject)); err != nil {
		t.Fatalf("open: %v", err)
	}
	confirmLinkSignIn(t, ctx)
	waitJS(t, ctx, 10*time.Second, "the project", `document.querySelector('#topic-rows tr[data-topic-id]')`)

	click(t, ctx, "#tab-topics")
	evalJS[bool](t, ctx, `([...document.querySelectorAll('#topic-rows button')].find((b) => b.textContent === "Trim").click(), true)`)
	waitJS(t, ctx, 5*time.Second, "the trim's toast", `document.querySelector('.toast-success')`)
	if !readsLeftToRight(t, ctx, ".toast-success", ", released 2.0 KiB.") {
		t.Errorf("the trim's toast %q: the text after the topic's name is reordered",
			evalJS[string](t, ctx, `document.querySelector('.toast-success').textContent`))
	}

	click(t, ctx, "#publish-send")
	waitJS(t, ctx, 5*time.Second, "the publish's answer", `document.querySelector('#publish-ok')`)
	if !readsLeftToRight(t, ctx, "#publish-ok", " (17 B).") {
		t.Errorf("the publish's answer %q: the text after the topic's name is reordered",
			evalJS[string](t, ctx, `document.querySelector('#publish-ok').textContent`))
	}

	click(t, ctx, "#tab-cache")
	evalJS[bool](t, ctx, `(document.querySelector('#cache-key').value = `+jsString("key\u202e")+`, true)`)
	click(t, ctx, "#cache-save")
	waitJS(t, ctx, 5*time.Second, "the cache write's answer", `document.querySelector('#cache-put-ok')`)
	if !readsLeftToRight(t, ctx, "#cache-put-ok", " — expires ") {
		t.Errorf("the cache write's answer %q: the text after the key is reordered",
			evalJS[string](t, ctx, `document.querySelector('#cache-put-ok').textContent`))
	}
}

// An error code the client has no sentence for gets the generic one, also
// when it names a property every object has ("constructor", "toString",
// "__proto__"): a server or proxy answering such a code showed the text of
// a built-in function, or "[object Object]", as the reason.
func TestAnUnknownErrorCodeGetsTheGenericSentence(t *testing.T) {
	ctx := startChromium(t)
	srv := consoleAPI(t)
	c, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("open: %v", err)
	}
	got := evalJS[string](t, ctx, `import("/js/errors.js").then(({ sentence }) => JSON.stringify([
		sentence("constructor", 400), sentence("toString", 400), sentence("__proto__", 500), sentence("hasOwnProperty", 409),
		sentence("not_found", 404)]))`)
	want := `["The request was refused.","The request was refused.","The server could not complete the request.",` +
		`"The request was refused.","There is nothing at this address."]`
	if got != want {
		t.Errorf("sentences:\n got %s\nwant %s", got, want)
	}
}
